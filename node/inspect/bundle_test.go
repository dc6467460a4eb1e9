package inspect

import (
	"bytes"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Routes name their device, as `ip route` does.
func TestNetlinkDumpNamesDevices(t *testing.T) {
	var b bytes.Buffer
	err := netlinkDump(func() ([]any, error) {
		return asAny(netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE))
	})(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), " dev lo table 255") {
		t.Fatalf("routes of the local table lack lo:\n%s", b.String())
	}
}

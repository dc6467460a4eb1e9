package inspect

import (
	"bytes"
	"os"
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

// The kernel tracker's settings come one per line, the module's absence as
// an error saying so.
func TestConntrackSettings(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		t.Skipf("nf_conntrack not loaded: %v", err)
	}
	var b bytes.Buffer
	if err := conntrackSettings("/proc/sys/net/netfilter")(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nnf_conntrack_max ", "\nnf_conntrack_tcp_timeout_established "} {
		if !strings.Contains("\n"+b.String(), want) {
			t.Errorf("settings lack %q:\n%s", want[1:], b.String())
		}
	}
	if err := conntrackSettings(t.TempDir())(&b); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("an empty directory: %v, want an error naming the module", err)
	}
}

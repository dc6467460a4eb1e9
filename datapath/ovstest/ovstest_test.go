package ovstest

import (
	"strings"
	"testing"
)

func TestStartCreatesNetdevBridge(t *testing.T) {
	o := Start(t)
	o.Run("ovs-vsctl", "add-br", "br-test", "--", "set", "bridge", "br-test", "datapath_type=netdev")
	out := o.Run("ovs-ofctl", "dump-flows", o.MgmtSocket("br-test"))
	if !strings.Contains(out, "NORMAL") {
		t.Fatalf("new bridge has no NORMAL flow: %q", out)
	}
}

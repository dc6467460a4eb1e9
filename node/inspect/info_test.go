package inspect

import (
	"net"
	"testing"
)

// The AgentInfo's podCIDR is empty, not "<nil>", on a Node without one of
// its own (networkPolicyOnly).
func TestPodCIDRString(t *testing.T) {
	if got := cidrString(nil); got != "" {
		t.Errorf("no podCIDR: %q, want empty", got)
	}
	_, n, _ := net.ParseCIDR("10.244.1.0/24")
	if got := cidrString(n); got != "10.244.1.0/24" {
		t.Errorf("podCIDR 10.244.1.0/24: %q", got)
	}
}

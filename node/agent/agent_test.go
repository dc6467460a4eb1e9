package agent

import (
	"net"
	"strings"
	"testing"
)

// A podCIDR outside clusterCIDR stops the start: the masquerade rule
// matches Pods by clusterCIDR, so that Node's Pods would reach the
// outside with addresses nothing routes back. The error names the key and
// both ranges.
func TestCheckPodCIDR(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		if s == "" {
			return nil
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		cluster, pod string
		ok           bool
	}{
		{"10.244.0.0/16", "10.244.3.0/24", true},
		{"10.244.0.0/16", "10.244.0.0/16", true},
		{"10.244.0.0/16", "", true}, // networkPolicyOnly: no podCIDR of its own
		{"10.244.0.0/16", "10.245.3.0/24", false},
		{"10.244.0.0/16", "10.244.0.0/15", false}, // starts inside, ends outside
		{"10.244.0.0/16", "192.168.1.0/24", false},
	} {
		err := checkPodCIDR("n1", cidr(tc.pod), cidr(tc.cluster))
		if (err == nil) != tc.ok {
			t.Errorf("clusterCIDR %s, podCIDR %q: %v, want ok %v", tc.cluster, tc.pod, err, tc.ok)
			continue
		}
		if err != nil {
			for _, want := range []string{"clusterCIDR", tc.cluster, "podCIDR", tc.pod, "n1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		}
	}
}

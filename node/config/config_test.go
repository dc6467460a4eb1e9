package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "seine.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := Load("", []string{"nodeName=n1"})
	if err != nil {
		t.Fatal(err)
	}
	if c.TunnelType != TunnelGeneve || c.OVSDatapathType != DatapathSystem || !c.SNATEnabled() || !c.PolicyEnabled() {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.LeaderElection.LeaseDuration.Duration != 15*time.Second {
		t.Fatalf("lease duration %s", c.LeaderElection.LeaseDuration.Duration)
	}
}

func TestFileAndOverrides(t *testing.T) {
	p := write(t, "nodeName: worker-1\ntunnelType: vxlan\nleaderElection:\n  leaseDuration: 6s\n")
	c, err := Load(p, []string{"tunnelType=gre", "leaderElection.renewDeadline=4s", "leaderElection.retryPeriod=1s", "snat=false"})
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "worker-1" || c.TunnelType != TunnelGRE || c.SNATEnabled() {
		t.Fatalf("got %+v", c)
	}
	le := c.LeaderElection
	if le.LeaseDuration.Duration != 6*time.Second || le.RenewDeadline.Duration != 4*time.Second || le.RetryPeriod.Duration != time.Second {
		t.Fatalf("leader election %+v", le)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"nodeName: a\ntunelType: vxlan\n", "tunelType"},
		{"nodeName: a\ntunnelType: ipip\n", "tunnelType"},
		{"nodeName: a\novsDatapathType: dpdk\n", "ovsDatapathType"},
		{"nodeName: a\nclusterCIDR: 10.244.0.0\n", "clusterCIDR"},
		{"nodeName: a\nmtu: 100\n", "mtu"},
		{"nodeName: a\ngatewayName: a-very-long-interface-name\n", "gatewayName"},
		{"nodeName: a\nleaderElection: {leaseDuration: 1s}\n", "leaderElection"},
		{"nodeName: a\nlogLevel: loud\n", "logLevel"},
	} {
		_, err := Load(write(t, tc.body), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: error %v does not name %s", tc.body, err, tc.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), nil); err == nil {
		t.Error("missing file accepted")
	}
	if _, err := Load("", []string{"novalue"}); err == nil {
		t.Error("override without '=' accepted")
	}
}

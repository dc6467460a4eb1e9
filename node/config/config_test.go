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
	if c.TunnelType != "" || c.OVSDatapathType != DatapathSystem || !c.SNATEnabled() || !c.PolicyEnabled() ||
		c.TrafficEncapMode != ModeEncap {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.LeaderElection.LeaseDuration.Duration != 15*time.Second {
		t.Fatalf("lease duration %s", c.LeaderElection.LeaseDuration.Duration)
	}
	// kube-proxy's conntrack defaults; a file's 0 leaves a setting alone.
	if ct := c.Proxy.Conntrack; ct.MaxPerCore != 32768 || ct.Min != 131072 ||
		ct.TCPEstablishedTimeout.Duration != 24*time.Hour || ct.TCPCloseWaitTimeout.Duration != time.Hour {
		t.Fatalf("conntrack defaults %+v", ct)
	}
	if a := c.LocalVIPAliases(); a == nil || a.String() != "169.254.192.0/18" {
		t.Fatalf("local VIP aliases %v, want 169.254.192.0/18", a)
	}
	c, err = Load(write(t, "nodeName: n1\nproxy:\n  localVIPAliasCIDR: 169.254.64.0/20\n  conntrack:\n    maxPerCore: 0\n    tcpCloseWaitTimeout: 0s\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ct := c.Proxy.Conntrack; ct.MaxPerCore != 0 || ct.TCPCloseWaitTimeout.Duration != 0 || ct.Min != 131072 ||
		ct.TCPEstablishedTimeout.Duration != 24*time.Hour {
		t.Fatalf("conntrack after a file's zeros %+v", ct)
	}
	if a := c.LocalVIPAliases(); a == nil || a.String() != "169.254.64.0/20" {
		t.Fatalf("local VIP aliases %v, want the file's 169.254.64.0/20", a)
	}
}

func TestFileAndOverrides(t *testing.T) {
	p := write(t, "nodeName: worker-1\ntunnelType: vxlan\nleaderElection:\n  leaseDuration: 6s\n")
	c, err := Load(p, []string{"tunnelType=gre", "leaderElection.renewDeadline=4s", "leaderElection.retryPeriod=1s", "trafficEncapMode=hybrid", "noSNAT=true"})
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "worker-1" || c.TunnelType != TunnelGRE || c.SNATEnabled() || c.TrafficEncapMode != ModeHybrid {
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
		{"nodeName: a\nnatChecksum: ignore\n", "natChecksum"},
		{"nodeName: a\nclusterCIDR: 10.244.0.0\n", "clusterCIDR"},
		{"nodeName: a\nmtu: 100\n", "mtu"},
		{"nodeName: a\ngatewayName: a-very-long-interface-name\n", "gatewayName"},
		{"nodeName: a\nbridgeName: \"br:int\"\n", "bridgeName"},
		{"nodeName: a\nclusterCIDR: 10.0.0.0/8\nserviceCIDR: 10.96.0.0/16\n", "serviceCIDR"},
		{"nodeName: a\nleaderElection: {leaseDuration: 1s}\n", "leaderElection"},
		{"nodeName: a\nlogLevel: loud\n", "logLevel"},
		{"nodeName: a\nproxy: {conntrack: {maxPerCore: -1}}\n", "proxy.conntrack"},
		{"nodeName: a\nproxy: {conntrack: {tcpCloseWaitTimeout: 10ms}}\n", "proxy.conntrack.tcpCloseWaitTimeout"},
		{"nodeName: a\nproxy: {conntrack: {tcpEstablishedTimeout: 720h}}\n", "proxy.conntrack.tcpEstablishedTimeout"},
		{"nodeName: a\nproxy: {conntrack: {min: 2000000}}\n", "proxy.conntrack.min"},
		{"nodeName: a\nproxy: {localVIPAliasCIDR: 10.0.0.0/24}\n", "proxy.localVIPAliasCIDR: 10.0.0.0/24 is not a /18 to /30 inside 169.254.0.0/16"},
		{"nodeName: a\nproxy: {localVIPAliasCIDR: 169.254.100.0/24}\n", "proxy.localVIPAliasCIDR: 169.254.100.0/24 holds 169.254.100.1"},
		{"nodeName: a\nproxy: {localVIPAliasCIDR: 169.254.128.0/17}\n", "not a /18 to /30"},
		{"nodeName: a\nproxy: {localVIPAliasCIDR: 169.254.160.0/19}\n", "holds 169.254.169.254"},
		{"nodeName: a\nproxy: {localVIPAliasCIDR: \"\"}\n", "proxy.localVIPAliasCIDR: \"\" is not an IPv4 CIDR"},
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

func TestTrafficModes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      []string
		env      string
		wantErr  string // "" = valid
		wantWarn string
		tunnel   bool
		direct   bool
		snat     bool
		ownsPods bool
	}{
		{name: "default encap", tunnel: true, snat: true, ownsPods: true},
		{name: "noEncap", set: []string{"trafficEncapMode=noEncap"}, direct: true, snat: true, ownsPods: true},
		{name: "noEncap noSNAT", set: []string{"trafficEncapMode=noEncap", "noSNAT=true"}, direct: true, ownsPods: true},
		{name: "hybrid noSNAT", set: []string{"trafficEncapMode=hybrid", "noSNAT=true"}, tunnel: true, direct: true, ownsPods: true},
		{name: "policy only", set: []string{"trafficEncapMode=networkPolicyOnly", "primaryCNIConflist=/etc/cni/net.d/10-ptp.conflist"}},
		{name: "policy only noSNAT warns", set: []string{"trafficEncapMode=networkPolicyOnly", "primaryCNIConflist=/etc/cni/net.d/10-ptp.conflist", "noSNAT=true"},
			wantWarn: "noSNAT"},
		{name: "unknown mode", set: []string{"trafficEncapMode=vxlan"}, wantErr: "trafficEncapMode"},
		{name: "mode names are case sensitive", set: []string{"trafficEncapMode=noencap"}, wantErr: "trafficEncapMode"},
		{name: "noSNAT with encap", set: []string{"noSNAT=true"}, wantErr: "noSNAT"},
		{name: "snat key replaced", set: []string{"trafficEncapMode=noEncap", "snat=false"}, wantErr: "noSNAT"},
		{name: "policy only without primary", set: []string{"trafficEncapMode=networkPolicyOnly"}, wantErr: "primaryCNIConflist"},
		{name: "relative primary", set: []string{"trafficEncapMode=networkPolicyOnly", "primaryCNIConflist=10-ptp.conflist"}, wantErr: "primaryCNIConflist"},
		{name: "noEncap without proxy", set: []string{"trafficEncapMode=noEncap", "proxy.enable=false"}, wantErr: AllowNoEncapWithoutProxyEnv},
		{name: "hybrid without proxy", set: []string{"trafficEncapMode=hybrid", "proxy.enable=false"}, wantErr: "proxy.enable"},
		{name: "noEncap without proxy, overridden", set: []string{"trafficEncapMode=noEncap", "proxy.enable=false"},
			env: "true", direct: true, snat: true, ownsPods: true, wantWarn: "proxy.enable"},
		{name: "override must say true", set: []string{"trafficEncapMode=noEncap", "proxy.enable=false"}, env: "1", wantErr: "proxy.enable"},
		{name: "encap without proxy", set: []string{"proxy.enable=false"}, tunnel: true, snat: true, ownsPods: true},
		{name: "geneve on the userspace datapath", set: []string{"ovsDatapathType=netdev", "tunnelType=geneve"},
			tunnel: true, snat: true, ownsPods: true, wantWarn: "tunnelType: geneve"},
		{name: "gre on the userspace datapath, hybrid", set: []string{"ovsDatapathType=netdev", "tunnelType=gre", "trafficEncapMode=hybrid"},
			tunnel: true, direct: true, snat: true, ownsPods: true, wantWarn: "tunnelType: gre"},
		{name: "vxlan on the userspace datapath", set: []string{"ovsDatapathType=netdev", "tunnelType=vxlan"}, tunnel: true, snat: true, ownsPods: true},
		{name: "geneve on the kernel datapath", set: []string{"tunnelType=geneve"}, tunnel: true, snat: true, ownsPods: true},
		{name: "geneve on the userspace datapath, no tunnel", set: []string{"ovsDatapathType=netdev", "tunnelType=geneve", "trafficEncapMode=noEncap"},
			direct: true, snat: true, ownsPods: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(AllowNoEncapWithoutProxyEnv, tc.env)
			c, err := Load("", append([]string{"nodeName=n1"}, tc.set...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := c.TrafficEncapMode
			if m.UsesTunnel() != tc.tunnel || m.RoutesDirectly() != tc.direct || c.SNATEnabled() != tc.snat || m.OwnsPodNetwork() != tc.ownsPods {
				t.Errorf("%s: tunnel %v direct %v snat %v ownsPods %v, want %v %v %v %v", m,
					m.UsesTunnel(), m.RoutesDirectly(), c.SNATEnabled(), m.OwnsPodNetwork(), tc.tunnel, tc.direct, tc.snat, tc.ownsPods)
			}
			warn := strings.Join(c.Warnings(), "\n")
			if (tc.wantWarn == "") != (warn == "") || !strings.Contains(warn, tc.wantWarn) {
				t.Errorf("warnings %q, want one naming %q", warn, tc.wantWarn)
			}
		})
	}
}

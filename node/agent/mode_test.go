package agent

import (
	"testing"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tunnel"
)

// TestPodMTUs: Pod interfaces keep the transport's MTU in every mode; the
// tunnel MTU (gateway, tunnel, Pod routes through the gateway) is smaller
// by the tunnel's overhead only where the mode tunnels; a configured mtu
// is both.
func TestPodMTUs(t *testing.T) {
	transport := tunnel.Transport{Name: "eth0", MTU: 1500}
	for _, tc := range []struct {
		mode   config.TrafficEncapMode
		tunnel string
		mtu    int
		want   mtus
	}{
		{config.ModeEncap, tunnel.Geneve, 0, mtus{Pod: 1500, Tunnel: 1450}},
		{config.ModeEncap, tunnel.VXLAN, 0, mtus{Pod: 1500, Tunnel: 1450}},
		{config.ModeEncap, tunnel.GRE, 0, mtus{Pod: 1500, Tunnel: 1458}},
		{config.ModeHybrid, tunnel.Geneve, 0, mtus{Pod: 1500, Tunnel: 1450}},
		{config.ModeNoEncap, tunnel.Geneve, 0, mtus{Pod: 1500, Tunnel: 1500}},
		{config.ModeNetworkPolicyOnly, tunnel.Geneve, 0, mtus{Pod: 1500, Tunnel: 1500}},
		{config.ModeEncap, tunnel.Geneve, 1400, mtus{Pod: 1400, Tunnel: 1400}},
	} {
		cfg := config.Config{TrafficEncapMode: tc.mode, TunnelType: tc.tunnel, MTU: tc.mtu}
		got, err := podMTUs(cfg, transport)
		if err != nil || got != tc.want {
			t.Errorf("%s, %s, mtu %d: %+v, %v; want %+v", tc.mode, tc.tunnel, tc.mtu, got, err, tc.want)
		}
	}
	if _, err := podMTUs(config.Config{TrafficEncapMode: config.ModeEncap, TunnelType: "ipip"}, transport); err == nil {
		t.Error("unknown tunnel type accepted")
	}
}

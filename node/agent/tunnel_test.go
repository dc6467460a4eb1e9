package agent

import (
	"maps"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tunnel"
)

// TestTunnelVotes: a joining Node counts the tunnel types of the Nodes
// whose daemons still write their AgentInfos; Nodes silent for longer than
// the staleness bound count only when no peer is live, and the Node's own
// AgentInfo is its reported type, never a vote.
func TestTunnelVotes(t *testing.T) {
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	info := func(name, typ string, age time.Duration) opsv1alpha1.AgentInfo {
		a := opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: name}}
		a.Status.TunnelType = typ
		a.Status.LastHeartbeatTime = metav1.NewTime(now.Add(-age))
		return a
	}
	for _, tc := range []struct {
		name         string
		list         []opsv1alpha1.AgentInfo
		wantReported string
		wantPeers    map[string]int
	}{
		{"live peers only",
			[]opsv1alpha1.AgentInfo{info("a", tunnel.VXLAN, time.Minute), info("b", tunnel.VXLAN, 10*time.Second),
				info("down1", tunnel.Geneve, time.Hour), info("down2", tunnel.Geneve, 4*time.Minute), info("down3", tunnel.Geneve, 24*time.Hour)},
			"", map[string]int{tunnel.VXLAN: 2}},
		{"at the bound still live",
			[]opsv1alpha1.AgentInfo{info("a", tunnel.GRE, staleAgentInfo), info("b", tunnel.VXLAN, staleAgentInfo+time.Second)},
			"", map[string]int{tunnel.GRE: 1}},
		{"no live peer: every peer counts",
			[]opsv1alpha1.AgentInfo{info("a", tunnel.Geneve, time.Hour), info("b", tunnel.Geneve, 2*time.Hour), info("c", tunnel.VXLAN, time.Hour)},
			"", map[string]int{tunnel.Geneve: 2, tunnel.VXLAN: 1}},
		{"live peers without a type: every peer counts",
			[]opsv1alpha1.AgentInfo{info("a", "", time.Second), info("b", tunnel.Geneve, time.Hour)},
			"", map[string]int{"": 1, tunnel.Geneve: 1}},
		{"own AgentInfo is reported, however old",
			[]opsv1alpha1.AgentInfo{info("self", tunnel.GRE, 48*time.Hour), info("a", tunnel.VXLAN, time.Second)},
			tunnel.GRE, map[string]int{tunnel.VXLAN: 1}},
		{"nothing listed", nil, "", map[string]int{}},
	} {
		reported, peers := tunnelVotes(tc.list, "self", now, staleAgentInfo)
		if reported != tc.wantReported || !maps.Equal(peers, tc.wantPeers) {
			t.Errorf("%s: reported %q, peers %v; want %q, %v", tc.name, reported, peers, tc.wantReported, tc.wantPeers)
		}
	}
	// The decision itself: three Geneve Nodes long gone outvote two live
	// VXLAN Nodes no longer.
	list := []opsv1alpha1.AgentInfo{info("a", tunnel.VXLAN, time.Second), info("b", tunnel.VXLAN, time.Second),
		info("x", tunnel.Geneve, time.Hour), info("y", tunnel.Geneve, time.Hour), info("z", tunnel.Geneve, time.Hour)}
	_, peers := tunnelVotes(list, "self", now, staleAgentInfo)
	if typ, from := tunnel.PickType(tunnel.TypeEvidence{Peers: peers}); typ != tunnel.VXLAN || from != tunnel.FromPeers {
		t.Errorf("picked %s from %s; want vxlan from the live peers", typ, from)
	}
}

// TestSegmentPortNeeded: the segmentation port exists only where packets
// pass through it: with userspace TSO on the userspace datapath, for an
// OVS tunnel port's packets, or for NATed packets when nothing rewrites
// their partial checksums. The default (a kernel VXLAN device, the
// rewrite) and the kernel datapath go without.
func TestSegmentPortNeeded(t *testing.T) {
	netdev := config.Config{OVSDatapathType: config.DatapathNetdev}
	system := config.Config{OVSDatapathType: config.DatapathSystem}
	for _, tc := range []struct {
		name string
		cfg  config.Config
		tso  bool
		b    pipeline.Bridge
		want bool
	}{
		{"kernel VXLAN, rewrite", netdev, true, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelByMAC, PartialChecksumsRewritten: true}, false},
		{"kernel VXLAN, detour", netdev, true, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelByMAC}, true},
		{"OVS tunnel port, rewrite", netdev, true, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelSegmented, PartialChecksumsRewritten: true}, true},
		{"OVS tunnel port, detour", netdev, true, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelSegmented}, true},
		{"no tunnel, rewrite", netdev, true, pipeline.Bridge{Tunnel: pipeline.TunnelSegmented, PartialChecksumsRewritten: true}, false},
		{"no tunnel, detour", netdev, true, pipeline.Bridge{Tunnel: pipeline.TunnelSegmented}, true},
		{"no userspace TSO", netdev, false, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelByTunDst}, false},
		{"kernel datapath", system, true, pipeline.Bridge{TunnelPort: 1, Tunnel: pipeline.TunnelByTunDst}, false},
	} {
		if got := segmentPortNeeded(tc.cfg, tc.tso, tc.b); got != tc.want {
			t.Errorf("%s: segmentPortNeeded = %v, want %v", tc.name, got, tc.want)
		}
	}
}

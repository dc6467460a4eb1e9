package inspect

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
)

// Every flow of the pipeline, as OVS dumps it back, has the key of the
// desired flow it came from, so `get ovsflows` joins them (no entry shows
// as "missing" or "unknown" by mistake).
func TestDumpedFlowsJoinDesired(t *testing.T) {
	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := of.Dial(ctx, o.MgmtSocket("br-int"), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, pod, _ := net.ParseCIDR("10.244.1.0/24")
	mac, _ := net.ParseMAC("0a:00:00:00:00:01")
	pmac, _ := net.ParseMAC("0a:00:00:00:01:05")
	b := pipeline.Bridge{Round: 3, GatewayPort: 2, GatewayMAC: mac, GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: pod,
		NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
	var desired []of.Flow
	desired = append(desired, pipeline.BaseFlows(b)...)
	desired = append(desired, pipeline.PolicyBaseFlows(b)...)
	desired = append(desired, pipeline.ServiceBaseFlows(b)...)
	desired = append(desired, pipeline.TraceFlows(b)...)
	desired = append(desired, pipeline.PodFlows(b, pipeline.Pod{OFPort: 17, IP: net.ParseIP("10.244.1.5"), MAC: pmac, IngressIsolated: true})...)
	_, peer, _ := net.ParseCIDR("10.244.2.0/24")
	desired = append(desired, pipeline.PeerNodeFlows(b, pipeline.PeerNode{ID: 4, PodCIDR: peer, NodeIP: net.ParseIP("198.18.0.12"),
		GatewayIP: net.ParseIP("10.244.2.1")})...)
	s := flowsync.New(c)
	if err := s.Set(ctx, "all", desired); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, f := range desired {
		keys[flowsync.Key(canonical(f))] = true
	}
	dump, err := c.DumpFlows(ctx, nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dump) != len(keys) {
		t.Errorf("%d flows dumped, %d desired", len(dump), len(keys))
	}
	for _, st := range dump {
		if k := flowsync.Key(canonical(st.Flow)); !keys[k] {
			t.Errorf("dumped flow has no desired twin: %s", k)
		}
	}
}

// A Service's flows are those its frontends own, and those that carry a
// frontend's cookie without an owner (the learned affinity flows, in OVS
// only).
func TestServiceFlow(t *testing.T) {
	ids := map[uint32]bool{7: true}
	for _, tc := range []struct {
		name   string
		fl     of.Flow
		owners []string
		want   bool
	}{
		{"owned", of.Flow{}, []string{pipeline.ServiceOwner(7)}, true},
		{"another frontend's", of.Flow{}, []string{pipeline.ServiceOwner(8)}, false},
		{"learned, its cookie", of.Flow{Cookie: pipeline.Cookie(3, pipeline.CategoryService, 7)}, nil, true},
		{"learned, another's cookie", of.Flow{Cookie: pipeline.Cookie(3, pipeline.CategoryService, 8)}, nil, false},
		{"a Pod's cookie with the same ID", of.Flow{Cookie: pipeline.Cookie(3, pipeline.CategoryPod, 7)}, nil, false},
	} {
		if got := serviceFlow(tc.fl, tc.owners, ids); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

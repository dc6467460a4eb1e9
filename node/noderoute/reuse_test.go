package noderoute

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netnstest"
)

// TestReusedIPAndPodCIDR: a Node that gets the Node IP and podCIDR another
// Node had, and is synced before that Node's change or deletion is, keeps
// its tunnel entry and route when the other Node's old ones are removed
// (both are known by the IP or the podCIDR alone). Once no peer has them,
// they go.
func TestReusedIPAndPodCIDR(t *testing.T) {
	netnstest.Run(t, func() {
		gatewayDevice(t)
		j := &journal{}
		nodes := informers.NewSharedInformerFactory(fake.NewSimpleClientset(), 0).Core().V1().Nodes()
		store := nodes.Informer().GetIndexer()
		_, podCIDR, _ := net.ParseCIDR("10.244.0.0/24")
		c, err := New(nodes, Config{NodeName: "self", Mode: config.ModeEncap, Gateway: "gw0", Flows: flowRec{j}, SNAT: snatRec{},
			Tunnel: tunnelRec{j}, Bridge: pipeline.Bridge{Round: 1, PodCIDR: podCIDR, TunnelPort: 1, Tunnel: pipeline.TunnelByMAC}},
			zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// set makes the informer's cache hold n (nil: not the Node
		// named) and syncs the Nodes named, in order, on this thread.
		set := func(name string, n *corev1.Node, sync ...string) {
			t.Helper()
			old, ok, _ := store.GetByKey(name)
			switch {
			case n != nil && ok:
				err = store.Update(n)
			case n != nil:
				err = store.Add(n)
			case ok:
				err = store.Delete(old)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sync {
				if err := c.sync(ctx, s); err != nil {
					t.Fatalf("sync %s: %v", s, err)
				}
			}
		}
		// has checks the tunnel's entries and the routes to peer
		// podCIDRs (10.244.1.0/24 and 10.244.2.0/24).
		has := func(when string, ips []string, cidrs ...string) {
			t.Helper()
			j.mu.Lock()
			got := slices.Sorted(slices.Values(j.ips))
			j.mu.Unlock()
			if !slices.Equal(got, ips) {
				t.Errorf("%s: the tunnel knows %v, want %v; calls %v", when, got, ips, j.entries())
			}
			var want []string
			for _, cidr := range cidrs {
				want = append(want, cidr+" via "+strings.TrimSuffix(cidr, "0/24")+"1 dev gw0 proto 95 onlink")
			}
			var routed []string
			for _, l := range strings.Split(routes(t), "\n") {
				if strings.Contains(l, "proto 95") {
					routed = append(routed, l)
				}
			}
			if !slices.Equal(routed, want) {
				t.Errorf("%s: routes %q, want %q", when, routed, want)
			}
		}

		set("peer-a", node("peer-a", "198.19.240.2", "10.244.1.0/24"), "peer-a")
		has("peer-a connected", []string{"198.19.240.2"}, "10.244.1.0/24")

		// peer-a moves; peer-b takes its IP and podCIDR and is synced
		// first.
		set("peer-a", node("peer-a", "198.19.240.3", "10.244.2.0/24"))
		set("peer-b", node("peer-b", "198.19.240.2", "10.244.1.0/24"), "peer-b", "peer-a")
		has("peer-a moved after peer-b took its place", []string{"198.19.240.2", "198.19.240.3"}, "10.244.1.0/24", "10.244.2.0/24")

		// peer-a is deleted; peer-c takes its IP and podCIDR and is
		// synced first.
		set("peer-a", nil)
		set("peer-c", node("peer-c", "198.19.240.3", "10.244.2.0/24"), "peer-c", "peer-a")
		has("peer-a deleted after peer-c took its place", []string{"198.19.240.2", "198.19.240.3"}, "10.244.1.0/24", "10.244.2.0/24")
		if !slices.Contains(j.entries(), "flows-del node/peer-a") {
			t.Errorf("peer-a's flows not removed: %v", j.entries())
		}

		// With no other peer having them, they go.
		set("peer-c", nil, "peer-c")
		has("peer-c deleted", []string{"198.19.240.2"}, "10.244.1.0/24")
		set("peer-b", node("peer-b", "198.19.240.2", ""), "peer-b")
		has("peer-b lost its podCIDR", nil)
	})
}

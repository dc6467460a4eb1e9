package noderoute

import (
	"context"
	"net"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netnstest"
)

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func TestRouteFor(t *testing.T) {
	local := []*net.IPNet{cidr("198.18.0.0/24"), cidr("198.18.5.7/32")}
	for _, tc := range []struct {
		mode config.TrafficEncapMode
		peer string
		want Route
	}{
		{config.ModeEncap, "198.18.0.12", RouteTunnel},
		{config.ModeEncap, "198.18.1.13", RouteTunnel},
		{config.ModeHybrid, "198.18.0.12", RouteDirect},
		{config.ModeHybrid, "198.18.1.13", RouteTunnel},
		{config.ModeHybrid, "198.18.5.7", RouteDirect},
		{config.ModeHybrid, "198.18.5.8", RouteTunnel},
		{config.ModeNoEncap, "198.18.0.12", RouteDirect},
		{config.ModeNoEncap, "198.18.1.13", RouteUnderlay},
		{config.ModeNetworkPolicyOnly, "198.18.0.12", RouteNone},
	} {
		if got := RouteFor(tc.mode, local, net.ParseIP(tc.peer)); got != tc.want {
			t.Errorf("%s to %s: %s, want %s", tc.mode, tc.peer, got, tc.want)
		}
	}
	if got := RouteFor(config.ModeHybrid, nil, net.ParseIP("198.18.0.12")); got != RouteTunnel {
		t.Errorf("hybrid without transport networks: %s, want tunnel", got)
	}
}

type flowRecorder struct {
	mu    sync.Mutex
	flows map[string][]of.Flow
}

func (f *flowRecorder) Set(_ context.Context, owner string, flows []of.Flow) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(flows) == 0 {
		delete(f.flows, owner)
	} else {
		f.flows[owner] = flows
	}
	return nil
}

type snatRecorder struct{ ips map[string]net.IP }

func (s *snatRecorder) SetNodeIP(node string, ip net.IP) {
	if ip == nil {
		delete(s.ips, node)
	} else {
		s.ips[node] = ip
	}
}
func (s *snatRecorder) Sync(context.Context) error  { return nil }
func (s *snatRecorder) Prune(context.Context) error { return nil }

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	return string(out)
}

// routes lists the main table's routes to 10.244.0.0/16 and the two
// routes that are not the controller's, one line each, sorted.
func routes(t *testing.T) string {
	t.Helper()
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(run(t, "ip", "-4", "route", "show")), "\n") {
		if strings.HasPrefix(l, "10.") || strings.HasPrefix(l, "198.19.") {
			keep = append(keep, strings.Join(strings.Fields(l), " "))
		}
	}
	sort.Strings(keep)
	return strings.Join(keep, "\n")
}

func node(name, ip, podCIDR string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

// TestModeChangesConverge runs controllers of each mode, one after the
// other as restarts with a new configuration would, over the same host
// routing table (a fresh network namespace with a transport and a gateway
// interface), and checks the routes and flows each leaves: tunnel routes
// via the peers' gateways in encap; a direct route to the same-subnet
// peer in hybrid and noEncap; nothing in networkPolicyOnly; none of the
// previous mode's routes once the stale ones are removed; the Service
// proxy's and unrelated routes untouched. A transport address change moves
// the peers between direct and the other kind.
func TestModeChangesConverge(t *testing.T) {
	netnstest.Run(t, func() {
		// veth pairs stand for the interfaces (this kernel has no dummy
		// module); only the ends named tr0 and gw0 get addresses.
		for _, l := range []string{"tr0", "gw0"} {
			run(t, "ip", "link", "add", l, "type", "veth", "peer", "name", l+"p")
			run(t, "ip", "link", "set", l+"p", "up")
			run(t, "ip", "link", "set", l, "up")
		}
		run(t, "ip", "addr", "add", "198.18.0.11/24", "dev", "tr0")
		run(t, "ip", "addr", "add", "10.244.1.1/24", "dev", "gw0")
		// Not the controller's: the Service proxy's ClusterIP route and
		// an operator's static route.
		run(t, "ip", "route", "add", "10.96.0.0/16", "via", "169.254.100.2", "dev", "gw0", "onlink", "proto", "94")
		run(t, "ip", "route", "add", "198.19.0.0/16", "via", "198.18.0.254")
		untouched := "10.96.0.0/16 via 169.254.100.2 dev gw0 proto 94 onlink\n"
		const base = "10.244.1.0/24 dev gw0 proto kernel scope link src 10.244.1.1\n"
		const other = "\n198.19.0.0/16 via 198.18.0.254 dev tr0"

		f := informers.NewSharedInformerFactory(fake.NewSimpleClientset(), 0)
		nodes := f.Core().V1().Nodes()
		for _, n := range []*corev1.Node{node("n1", "198.18.0.11", "10.244.1.0/24"), node("n2", "198.18.0.12", "10.244.2.0/24"),
			node("n3", "198.18.1.13", "10.244.3.0/24")} {
			if err := nodes.Informer().GetIndexer().Add(n); err != nil {
				t.Fatal(err)
			}
		}
		flows := &flowRecorder{flows: map[string][]of.Flow{}}
		br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
			GatewayIP: net.ParseIP("10.244.1.1"), PodCIDR: cidr("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
		ctx := context.Background()
		// start runs a controller of mode over every Node, as Run does
		// (without its goroutines: netlink calls must stay on this
		// thread, in the test's namespace), and removes stale routes.
		start := func(mode config.TrafficEncapMode) *Controller {
			t.Helper()
			snat := &snatRecorder{ips: map[string]net.IP{}}
			cfg := Config{NodeName: "n1", Mode: mode, Transport: "tr0", Gateway: "gw0", Bridge: br, Flows: flows, SNAT: snat}
			if mode == config.ModeNetworkPolicyOnly {
				cfg.SNAT = nil
			}
			c, err := New(nodes, cfg, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			if mode.RoutesDirectly() {
				c.recheckTransport()
			}
			for _, n := range []string{"n1", "n2", "n3"} {
				if err := c.sync(ctx, n); err != nil {
					t.Fatalf("%s: sync %s: %v", mode, n, err)
				}
			}
			if err := c.removeStaleRoutes(); err != nil {
				t.Fatal(err)
			}
			if mode != config.ModeNetworkPolicyOnly && (snat.ips["n2"] == nil || snat.ips["n3"] == nil || snat.ips["n1"] == nil) {
				t.Errorf("%s: SNAT exemptions %v, want every Node", mode, snat.ips)
			}
			return c
		}
		tunnelled := func(node string) bool {
			for _, fl := range flows.flows[owner(node)] {
				for _, a := range fl.Actions {
					if _, ok := a.(of.SetTunDst); ok {
						return true
					}
				}
			}
			return false
		}
		check := func(mode config.TrafficEncapMode, wantRoutes string, wantTunnel map[string]bool) {
			t.Helper()
			want := strings.Split(strings.TrimSpace(wantRoutes), "\n")
			sort.Strings(want)
			if got := routes(t); got != strings.Join(want, "\n") {
				t.Errorf("%s: routes\n%s\nwant\n%s", mode, got, strings.Join(want, "\n"))
			}
			for _, n := range []string{"n2", "n3"} {
				has := len(flows.flows[owner(n)]) > 0
				if wantFlows := mode != config.ModeNetworkPolicyOnly; has != wantFlows || tunnelled(n) != wantTunnel[n] {
					t.Errorf("%s: flows of %s %v (tunnel %v), want flows %v, tunnel %v", mode, n, has, tunnelled(n), wantFlows, wantTunnel[n])
				}
			}
		}
		tunnelRoutes := untouched + base +
			"10.244.2.0/24 via 10.244.2.1 dev gw0 proto 95 onlink\n" +
			"10.244.3.0/24 via 10.244.3.1 dev gw0 proto 95 onlink" + other

		start(config.ModeEncap)
		check(config.ModeEncap, tunnelRoutes, map[string]bool{"n2": true, "n3": true})

		start(config.ModeHybrid)
		check(config.ModeHybrid, untouched+base+
			"10.244.2.0/24 via 198.18.0.12 dev tr0 proto 95\n"+
			"10.244.3.0/24 via 10.244.3.1 dev gw0 proto 95 onlink"+other, map[string]bool{"n3": true})

		c := start(config.ModeNoEncap)
		check(config.ModeNoEncap, untouched+base+"10.244.2.0/24 via 198.18.0.12 dev tr0 proto 95"+other, nil)
		if got := c.PeerRoutes(); got[RouteDirect] != 1 || got[RouteUnderlay] != 1 {
			t.Errorf("noEncap peer routes %v", got)
		}

		// The transport moves to the other subnet: n3 becomes direct, n2
		// is left to the underlay.
		run(t, "ip", "addr", "flush", "dev", "tr0")
		run(t, "ip", "addr", "add", "198.18.1.11/24", "dev", "tr0")
		run(t, "ip", "route", "add", "198.19.0.0/16", "via", "198.18.1.254")
		c.recheckTransport()
		for c.queue.Len() > 0 {
			c.processNext(ctx)
		}
		check(config.ModeNoEncap, untouched+base+"10.244.3.0/24 via 198.18.1.13 dev tr0 proto 95"+
			"\n198.19.0.0/16 via 198.18.1.254 dev tr0", nil)

		start(config.ModeNetworkPolicyOnly)
		check(config.ModeNetworkPolicyOnly, untouched+base+"198.19.0.0/16 via 198.18.1.254 dev tr0", nil)

		run(t, "ip", "addr", "flush", "dev", "tr0")
		run(t, "ip", "addr", "add", "198.18.0.11/24", "dev", "tr0")
		run(t, "ip", "route", "add", "198.19.0.0/16", "via", "198.18.0.254")
		start(config.ModeEncap)
		check(config.ModeEncap, tunnelRoutes, map[string]bool{"n2": true, "n3": true})

		// A route a release before RouteProtocol left (no protocol) to a
		// Node that is gone is still found and removed.
		run(t, "ip", "route", "add", "10.244.9.0/24", "via", "10.244.9.1", "dev", "gw0", "onlink")
		start(config.ModeEncap)
		check(config.ModeEncap, tunnelRoutes, map[string]bool{"n2": true, "n3": true})
	})
}

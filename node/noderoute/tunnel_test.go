package noderoute

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netnstest"
)

// journal records, in order, what the controller asked of its fakes.
type journal struct {
	mu  sync.Mutex
	log []string
	ips []string // the tunnel's peers
}

func (j *journal) add(s string) { j.mu.Lock(); j.log = append(j.log, s); j.mu.Unlock() }

func (j *journal) entries() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.log)
}

type flowRec struct{ j *journal }

func (f flowRec) Set(_ context.Context, owner string, flows []of.Flow) error {
	if len(flows) == 0 {
		f.j.add("flows-del " + owner)
	} else {
		f.j.add("flows " + owner)
	}
	return nil
}

type snatRec struct{}

func (snatRec) SetNodeIP(string, net.IP)    {}
func (snatRec) Sync(context.Context) error  { return nil }
func (snatRec) Prune(context.Context) error { return nil }

type tunnelRec struct{ j *journal }

func (t tunnelRec) AddPeer(ip net.IP) error {
	t.j.add("add " + ip.String())
	t.j.mu.Lock()
	if !slices.Contains(t.j.ips, ip.String()) {
		t.j.ips = append(t.j.ips, ip.String())
	}
	t.j.mu.Unlock()
	return nil
}

func (t tunnelRec) RemovePeer(ip net.IP) error {
	t.j.add("remove " + ip.String())
	t.j.mu.Lock()
	t.j.ips = slices.DeleteFunc(t.j.ips, func(s string) bool { return s == ip.String() })
	t.j.mu.Unlock()
	return nil
}

func (t tunnelRec) Peers() ([]net.IP, error) {
	t.j.mu.Lock()
	defer t.j.mu.Unlock()
	var out []net.IP
	for _, s := range t.j.ips {
		out = append(out, net.ParseIP(s))
	}
	return out, nil
}

// TestPeerTunnel: a tunnel device that picks the remote itself learns each
// peer before the peer's flows are installed (no packet reaches it for an
// unknown peer), forgets a peer after its flows are gone, follows a peer's
// new Node IP, and loses at start the entries of peers that no longer
// exist.
func TestPeerTunnel(t *testing.T) {
	netnstest.Run(t, func() {
		if out, err := exec.Command("ip", "link", "add", "gwt", "type", "veth", "peer", "name", "gwt1").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		_ = exec.Command("ip", "link", "set", "gwt", "up").Run()
		_ = exec.Command("ip", "link", "set", "gwt1", "up").Run()
		_ = exec.Command("ip", "addr", "add", "10.244.0.1/24", "dev", "gwt").Run() // as the gateway has
		j := &journal{ips: []string{"198.19.240.99"}}                              // left by a removed peer
		cs := fake.NewSimpleClientset(node("self", "198.19.240.1", "10.244.0.0/24"), node("peer-a", "198.19.240.2", "10.244.1.0/24"))
		factory := informers.NewSharedInformerFactory(cs, 0)
		_, podCIDR, _ := net.ParseCIDR("10.244.0.0/24")
		c, err := New(factory.Core().V1().Nodes(), Config{NodeName: "self", Mode: config.ModeEncap, Gateway: "gwt", Flows: flowRec{j}, SNAT: snatRec{},
			Tunnel: tunnelRec{j}, Bridge: pipeline.Bridge{Round: 1, PodCIDR: podCIDR, TunnelPort: 1, Tunnel: pipeline.TunnelByMAC}},
			zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		factory.Start(ctx.Done())
		factory.WaitForCacheSync(ctx.Done())
		// sync runs here, on the test's thread in its namespace (the
		// controller's workers would run on other threads).
		syncNode := func(name string) {
			t.Helper()
			if err := c.sync(ctx, name); err != nil {
				t.Fatalf("sync %s: %v", name, err)
			}
		}
		waitCache := func(what string, cond func() bool) {
			t.Helper()
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true,
				func(context.Context) (bool, error) { return cond(), nil }); err != nil {
				t.Fatalf("informer cache: %s", what)
			}
		}
		before := func(log []string, a, b string) bool {
			ia, ib := slices.Index(log, a), slices.Index(log, b)
			return ia >= 0 && ib >= 0 && ia < ib
		}
		syncNode("self")
		syncNode("peer-a")
		if err := c.removeStaleTunnelPeers(); err != nil {
			t.Fatal(err)
		}
		if l := j.entries(); !before(l, "add 198.19.240.2", "flows node/peer-a") || !slices.Contains(l, "remove 198.19.240.99") {
			t.Fatalf("want peer-a added before its flows and the stale entry removed: %v", l)
		}
		n := node("peer-a", "198.19.240.3", "10.244.1.0/24")
		if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitCache("peer-a's new IP", func() bool {
			got, err := c.lister.Get("peer-a")
			return err == nil && InternalIP(got).String() == "198.19.240.3"
		})
		syncNode("peer-a")
		if l := j.entries(); !before(l, "add 198.19.240.3", "remove 198.19.240.2") {
			t.Fatalf("want peer-a's new IP added, then the old one removed: %v", l)
		}
		if err := cs.CoreV1().Nodes().Delete(ctx, "peer-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitCache("peer-a gone", func() bool { _, err := c.lister.Get("peer-a"); return err != nil })
		syncNode("peer-a")
		if l := j.entries(); !before(l, "flows-del node/peer-a", "remove 198.19.240.3") {
			t.Fatalf("want peer-a's flows removed, then its tunnel entry: %v", l)
		}
		if slices.Contains(j.entries(), "add 198.19.240.1") {
			t.Errorf("this Node was added as its own peer: %v", j.entries())
		}
	})
}

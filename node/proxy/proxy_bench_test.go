package proxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
)

// benchProxier returns a Proxier programming a private OVS bridge (no
// informers, no nftables: the reject set is left out).
func benchProxier(b testing.TB) *Proxier {
	p, _ := ovsProxier(b, "")
	return p
}

// ovsProxier returns a Proxier on the bridge of sock ("" = a new private
// OVS) and the socket.
func ovsProxier(b testing.TB, sock string) (*Proxier, string) {
	if sock != "" {
		return dialProxier(b, sock), sock
	}
	o := ovstest.Start(b)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	sock = o.MgmtSocket("br-int")
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return dialProxier(b, sock), sock
}

func dialProxier(b testing.TB, sock string) *Proxier {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	c, err := of.Dial(ctx, sock, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	fs := flowsync.New(c)
	br := benchBridge
	if err := fs.Set(ctx, "pipeline", pipeline.BaseFlows(br)); err != nil {
		b.Fatal(err)
	}
	if err := fs.Set(ctx, "service-base", pipeline.ServiceBaseFlows(br)); err != nil {
		b.Fatal(err)
	}
	return &Proxier{cfg: Config{NodeName: "n1", Bridge: br}, flows: fs, sw: c, log: zap.NewNop(),
		installed: map[string]map[string]*portInstall{}, ids: newIDAllocator(pipeline.MaxServicePortID)}
}

// A restarted proxy gives every frontend the ID (and so the group) it had,
// whatever order Services arrive in, and removes the groups of Services
// that are gone.
func TestRestartKeepsServicePortIDs(t *testing.T) {
	p, sock := ovsProxier(t, "")
	ctx := context.Background()
	ids := map[string]uint32{}
	for i := 0; i < 20; i++ {
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for k, ports := range p.installed {
		for _, pi := range ports {
			ids[k] = pi.id
		}
	}
	// "Restart": a new Proxier on the same bridge, Services in reverse
	// order, s0 gone, the flows of the old round still installed.
	q := dialProxier(t, sock)
	if err := q.readPriorIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if len(q.prior) != 20 {
		t.Fatalf("learned %d prior IDs, want 20", len(q.prior))
	}
	for i := 19; i >= 1; i-- {
		if err := q.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for k, ports := range q.installed {
		for _, pi := range ports {
			if pi.id != ids[k] {
				t.Errorf("%s got port ID %d after restart, had %d", k, pi.id, ids[k])
			}
		}
	}
	if err := q.pruneGroups(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := q.sw.GroupIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 19 || slices.Contains(left, ids["ns/s0"]) {
		t.Errorf("groups after prune %v, want 19 without s0's %d", left, ids["ns/s0"])
	}
}

func benchPort(i, variant int) []PortState {
	sp := pipeline.ServicePort{VIPs: []net.IP{net.IPv4(10, 96, byte(i/250), byte(i%250+1))}, Protocol: 6, Port: 80}
	for e := 0; e < 3; e++ {
		sp.Endpoints = append(sp.Endpoints, pipeline.ServiceEndpoint{
			IP: net.IPv4(10, 244, byte(e), byte((i+variant)%250+1)), Port: 8080})
	}
	return []PortState{{Key: fmt.Sprintf("ns/s%d/http/TCP", i), Port: sp}}
}

// One Service's endpoints change while n Services are installed in a real
// OVS: the time of the whole incremental update (group modify, flow diff
// in one bundle).
func benchmarkChange(b *testing.B, n int) {
	p := benchProxier(b)
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := p.apply(ctx, fmt.Sprintf("ns/s%d", i), benchPort(i, 0)); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("installed %d services in %s", n, time.Since(start).Round(time.Millisecond))
	v := 0
	b.ResetTimer()
	for b.Loop() {
		v++
		if err := p.apply(ctx, "ns/s7", benchPort(7, v)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServiceChangeAt1000Services(b *testing.B)  { benchmarkChange(b, 1000) }
func BenchmarkServiceChangeAt10000Services(b *testing.B) { benchmarkChange(b, 10000) }

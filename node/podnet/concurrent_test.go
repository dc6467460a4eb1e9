package podnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	of "github.com/seine-net/seine/datapath/openflow"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// failFlows fails Set for the owners it is told to, before the switch
// sees anything: a flow installation that fails in the middle of a batch
// of concurrent ADDs.
type failFlows struct {
	Flows
	fail func(owner string) bool
}

func (f failFlows) Set(ctx context.Context, owner string, flows []of.Flow) error {
	if len(flows) > 0 && f.fail(owner) {
		return errors.New("injected flow failure")
	}
	return f.Flows.Set(ctx, owner, flows)
}

// TestConcurrentAddDel runs 200 ADDs at once on a real switch, some of
// which fail at different steps (the Pod's netns already has eth0: the
// veth step; injected: the flows step), then DELs every one of them at
// once. Every successful ADD gets its own IP and an OVS port with an
// ofport, every failed one is rolled back, and in the end no IP, OVS port,
// flow or veth is left.
func TestConcurrentAddDel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	const n = 200
	vethFails := func(i int) bool { return i%23 == 5 }
	flowFails := func(i int) bool { return i%29 == 7 }
	h.be.flows = failFlows{Flows: h.flows, fail: func(owner string) bool {
		var i int
		_, err := fmt.Sscanf(owner[strings.LastIndex(owner, "-")+1:], "%04d", &i)
		return err == nil && flowFails(i)
	}}
	reqs := make([]*cniserver.Request, n)
	for i := range reqs {
		netns := h.netns()
		if vethFails(i) {
			if err := netns.Do(func(ns.NetNS) error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"})
			}); err != nil {
				t.Fatal(err)
			}
		}
		reqs[i] = h.request(i, netns.Path())
	}

	errs := make([]error, n)
	ips := make([]net.IP, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := h.be.Add(ctx, reqs[i])
			errs[i] = err
			if err == nil {
				ips[i] = res.IPs[0].Address.IP
			}
		}()
	}
	close(start)
	wg.Wait()

	seen := map[string]int{}
	ok := 0
	for i, err := range errs {
		wantFail := vethFails(i) || flowFails(i)
		switch {
		case wantFail && err == nil:
			t.Errorf("ADD %d succeeded, want the injected failure", i)
		case !wantFail && err != nil:
			t.Errorf("ADD %d: %v", i, err)
		case err == nil:
			ok++
			if j, dup := seen[ips[i].String()]; dup {
				t.Errorf("ADDs %d and %d both got %s", j, i, ips[i])
			}
			seen[ips[i].String()] = i
		}
	}
	if got := len(h.ipam.List()); got != ok {
		t.Errorf("%d IPs allocated after %d successful ADDs", got, ok)
	}
	ports, err := h.db.ListPorts(ctx, "br-int")
	if err != nil {
		t.Fatal(err)
	}
	attached := 0
	for _, p := range ports {
		if p.ExternalIDs[ExtIDContainerID] != "" {
			attached++
			if p.OFPort <= 0 {
				t.Errorf("port %s has ofport %d", p.Name, p.OFPort)
			}
		}
	}
	if attached != ok {
		t.Errorf("%d Pod ports on the bridge after %d successful ADDs", attached, ok)
	}
	t.Logf("%d ADDs succeeded, %d failed as injected", ok, n-ok)

	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			del := *reqs[i]
			del.Command = cniserver.CmdDel
			if err := h.be.Del(ctx, &del); err != nil {
				t.Errorf("DEL %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if left := h.leftovers(ctx); len(left) > 0 {
		t.Errorf("left behind after every DEL (%d):\n%s", len(left), strings.Join(left, "\n"))
	}
}

// BenchmarkAdd measures ADDs into a real switch, in process (no plugin
// exec, no socket): what the daemon's CNI backend itself costs. For each
// level of concurrency it reports p50 and p99 latency, ADDs per second and
// the mean time of each step (seine_cni_add_step_duration_seconds).
func BenchmarkAdd(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (links, OVS)")
	}
	for _, c := range []int{1, 10, 50, 200} {
		b.Run(fmt.Sprintf("concurrent-%d", c), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			h := newHarness(b, ctx, zap.NewNop())
			total := max(c, 50)
			for i := 0; i < b.N; i++ {
				reqs := make([]*cniserver.Request, total)
				for j := range reqs {
					reqs[j] = h.request(i*total+j, h.netns().Path())
				}
				lat, wall, err := runAdds(ctx, h.be, reqs, c)
				if err != nil {
					b.Fatal(err)
				}
				reportLatency(b, lat, wall)
				for _, r := range reqs {
					del := *r
					if err := h.be.Del(ctx, &del); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportSteps(b, h)
		})
	}
}

// runAdds runs reqs with at most c in flight and returns each latency and
// the wall time of all.
func runAdds(ctx context.Context, be *Backend, reqs []*cniserver.Request, c int) ([]time.Duration, time.Duration, error) {
	lat := make([]time.Duration, len(reqs))
	errs := make([]error, len(reqs))
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range reqs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			_, errs[i] = be.Add(ctx, r)
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	return lat, time.Since(start), errors.Join(errs...)
}

func reportLatency(b *testing.B, lat []time.Duration, wall time.Duration) {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := min(len(s)-1, max(0, int(p*float64(len(s))+0.5)-1))
		return float64(s[i].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/wall.Seconds(), "adds/s")
}

// reportSteps reports the mean of every step of the ADDs so far.
func reportSteps(b *testing.B, h *harness) {
	mfs, err := h.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "seine_cni_add_step_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			b.ReportMetric(stepMean(m)*1000, label(m, "step")+"-ms")
		}
	}
}

func stepMean(m *dto.Metric) float64 {
	hist := m.GetHistogram()
	if hist.GetSampleCount() == 0 {
		return 0
	}
	return hist.GetSampleSum() / float64(hist.GetSampleCount())
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

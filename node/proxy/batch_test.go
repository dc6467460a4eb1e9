package proxy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	of "github.com/seine-net/seine/datapath/openflow"
)

// rejectGroup is the switch with one group ID refused: any bundle that
// adds or modifies it fails, as a switch rejecting a bad group would.
type rejectGroup struct {
	Switch
	id    uint32
	calls int
}

func (r *rejectGroup) ApplyGroups(ctx context.Context, mods []of.GroupMod) error {
	r.calls++
	for _, m := range mods {
		if m.Group.ID == r.id && m.Op != of.GroupOpDelete {
			return fmt.Errorf("group %d refused", r.id)
		}
	}
	return r.Switch.ApplyGroups(ctx, mods)
}

// TestBatchProgramsServicesTogether programs 200 Services in one batch on
// a real switch: every Service gets its group and flows, with a handful of
// round trips; a second batch after a "restart" (groups on the switch, IDs
// read back) modifies the groups in place; and a batch holding a Service
// the switch refuses programs every other Service and fails that one only.
func TestBatchProgramsServicesTogether(t *testing.T) {
	o, sock := startOVS(t)
	p := dialProxier(t, sock)
	ctx := context.Background()
	const n = 200
	wants := map[string][]PortState{}
	for i := 0; i < n; i++ {
		wants[fmt.Sprintf("ns/s%d", i)] = benchPort(i, 0)
	}
	rec := &rejectGroup{Switch: p.sw}
	p.sw = rec
	if errs := p.applyBatch(ctx, wants); len(errs) > 0 {
		t.Fatalf("batch: %v", errs)
	}
	if rec.calls > 2 {
		t.Errorf("%d group round trips for one batch of %d Services, want at most 2", rec.calls, n)
	}
	groups := func() int {
		return strings.Count(o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-groups", sock), "group_id=")
	}
	flowsOf := func(vip string) int {
		return strings.Count(o.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", sock, "ip,nw_dst="+vip), "\n")
	}
	if g := groups(); g != n {
		t.Fatalf("%d groups after the batch, want %d", g, n)
	}
	// What operators see (seinectl get service): every frontend, sorted.
	fs, err := p.Frontends(ctx)
	if err != nil || len(fs) != n {
		t.Fatalf("frontends: %d (%v), want %d", len(fs), err, n)
	}
	if f := fs[0]; f.Service != "ns/s0" || f.Port != "http/TCP" || f.Kind != "internal" ||
		f.ServicePort.ID == 0 || len(f.ServicePort.Endpoints) != 3 {
		t.Fatalf("first frontend %+v; want ns/s0 http/TCP internal with its ID and 3 endpoints", f)
	}
	// While the proxy holds its lock (programming, ovs-vswitchd away),
	// Frontends gives up when its context ends.
	p.mu.Lock()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = p.Frontends(short)
	cancel()
	p.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("Frontends under the proxy's lock: %v, want an error saying the proxy is busy", err)
	}
	for _, i := range []int{0, 77, n - 1} {
		if flowsOf(wants[fmt.Sprintf("ns/s%d", i)][0].Port.VIPs[0].String()) == 0 {
			t.Fatalf("no flows for Service %d", i)
		}
	}

	// Restart: a new proxier learns IDs and groups from the switch and
	// programs every Service again, endpoints changed, in one batch.
	q := dialProxier(t, sock)
	if err := q.readPriorIDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.readExistingGroups(ctx); err != nil {
		t.Fatal(err)
	}
	rec2 := &rejectGroup{Switch: q.sw}
	q.sw = rec2
	for i := 0; i < n; i++ {
		wants[fmt.Sprintf("ns/s%d", i)] = benchPort(i, 1)
	}
	if errs := q.applyBatch(ctx, wants); len(errs) > 0 {
		t.Fatalf("batch after restart: %v", errs)
	}
	if rec2.calls > 2 {
		t.Errorf("%d group round trips after restart, want at most 2 (modify in place, no add-then-modify)", rec2.calls)
	}
	if len(q.existing) != 0 {
		t.Errorf("%d existing groups left unclaimed", len(q.existing))
	}
	if g := groups(); g != n {
		t.Fatalf("%d groups after the restart batch, want %d", g, n)
	}

	// One Service whose group the switch refuses: the others still get
	// programmed (one at a time), the refused one fails alone.
	bad := q.installed["ns/s13"]["ns/s13/http/TCP"].id
	rec2.id = bad
	for i := 0; i < n; i++ {
		wants[fmt.Sprintf("ns/s%d", i)] = benchPort(i, 2)
	}
	errs := q.applyBatch(ctx, wants)
	if len(errs) != 1 || errs["ns/s13"] == nil {
		t.Fatalf("errors of a batch with one refused Service: %v", errs)
	}
	dump := o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-groups", sock)
	ip := benchPort(14, 2)[0].Port.Endpoints[0].IP.To4()
	if want := fmt.Sprintf("0x%x->", uint32(ip[0])<<24|uint32(ip[1])<<16|uint32(ip[2])<<8|uint32(ip[3])); !strings.Contains(dump, want) {
		t.Errorf("Service 14 not reprogrammed after the refused batch (no endpoint %s, %s, in the groups)", ip, want)
	}
}

// TestProgrammingLatency records trigger times from EndpointSlices and
// observes them once their Service is programmed, as kube-proxy does:
// only additions and updates after the start, back in the queue when the
// sync fails.
func TestProgrammingLatency(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.start = time.Now().Add(-time.Minute)
	slice := func(svc string, at time.Time) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
			Labels:      map[string]string{discoveryv1.LabelServiceName: svc},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}}}
	}
	m.triggered(slice("a", time.Now().Add(-1500*time.Millisecond)))
	m.triggered(slice("a", m.start.Add(-time.Second))) // before the start: ignored
	m.triggered(slice("b", time.Now().Add(-100*time.Millisecond)))
	ts := m.checkout("ns/a")
	if len(ts) != 1 {
		t.Fatalf("trigger times of ns/a: %v", ts)
	}
	m.putBack("ns/a", ts) // the sync failed
	m.programmed(m.checkout("ns/a"))
	m.programmed(m.checkout("ns/b"))
	gathered := func(name string) *dto.Metric {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0]
			}
		}
		t.Fatalf("no single series %s in %v", name, mfs)
		return nil
	}
	h := gathered(ProgrammingLatencyName).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 1.5 || h.GetSampleSum() > 10 {
		t.Errorf("histogram: %d samples, sum %.3f s; want 2, about 1.6 s", h.GetSampleCount(), h.GetSampleSum())
	}
	var le []float64
	for _, b := range h.GetBucket() {
		le = append(le, b.GetUpperBound())
	}
	if !slices.Equal(le[:4], []float64{0.25, 0.5, 1, 2}) || le[len(le)-1] != 300 || len(le) != 80 {
		t.Errorf("buckets %v, want kube-proxy's", le)
	}
	if m.checkout("ns/a") != nil {
		t.Error("trigger times observed twice")
	}

	// The last sync's time, as kube-proxy's
	// kubeproxy_sync_proxy_rules_last_timestamp_seconds: 0 before any.
	if v := gathered(LastSyncName).GetGauge().GetValue(); v != 0 {
		t.Errorf("%s = %v before any sync, want 0", LastSyncName, v)
	}
	before := time.Now()
	m.synced()
	v := gathered(LastSyncName).GetGauge().GetValue()
	if at := time.Unix(0, int64(v*1e9)); at.Before(before.Add(-time.Millisecond)) || at.After(time.Now()) {
		t.Errorf("%s = %v (%v), want the time of the sync (%v)", LastSyncName, v, at, before)
	}

	// Batches and purges, as operators count them.
	m.batchDone(3 * time.Millisecond)
	m.batchDone(40 * time.Millisecond)
	if h := gathered(SyncDurationName).GetHistogram(); h.GetSampleCount() != 2 || h.GetBucket()[0].GetUpperBound() != 0.001 ||
		math.Abs(h.GetSampleSum()-0.043) > 1e-9 {
		t.Errorf("%s: %d samples, sum %v s, first bucket %v; want 2, 0.043 s, kube-proxy's 1 ms", SyncDurationName,
			h.GetSampleCount(), h.GetSampleSum(), h.GetBucket()[0].GetUpperBound())
	}
	m.purged()
	if v := gathered(DatapathPurgesName).GetCounter().GetValue(); v != 1 {
		t.Errorf("%s = %v after one purge", DatapathPurgesName, v)
	}
}

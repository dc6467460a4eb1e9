package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	of "github.com/seine-net/seine/datapath/openflow"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// TestSetIsolation restores a Pod port (a veth attached to a real
// OVS bridge, as a daemon restart finds it), then isolates it: the Pod's
// Classifier and L2Forwarding flows on the switch carry the isolation
// bits, and after DEL a late SetIsolation installs nothing. The port
// records an egress limit: the restore adds its meter, the Classifier flow
// keeps going through it whatever the isolation, and DEL removes it.
func TestSetIsolation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	be, alloc := h.be, h.ipam
	cid, ifn := restoreLimitedPod(ctx, h)
	mac := "0a:58:0a:f4:01:05"
	// The allocation never reached the (fresh) IPAM directory, as when a
	// daemon stops in the middle of an ADD: the restart holds it again.
	if ip, ok := alloc.Lookup(cid, ifn); !ok || ip.String() != "10.244.1.5" {
		t.Errorf("after RestorePods the Pod's address is not held: %v %v", ip, ok)
	}

	podFlows := func() string { return isolationFlows(h) }
	// ovs-ofctl prints a 1-bit load into reg0[24] as
	// "load:0x1->NXM_NX_REG0[24]".
	bit := func(dump string, n string) bool { return strings.Contains(dump, "NXM_NX_REG0["+n+"]") }
	if d := podFlows(); strings.Count(d, "\n") != 1 || !strings.Contains(d, "dl_dst="+mac) || bit(d, "24") || bit(d, "25") {
		t.Fatalf("restored Pod flows are missing or isolated:\n%s", d)
	}
	if err := be.SetIsolation(ctx, "ns", "web", true, false); err != nil {
		t.Fatal(err)
	}
	if d := podFlows(); !bit(d, "24") || bit(d, "25") {
		t.Errorf("after isolating for ingress:\n%s", d)
	}
	if err := be.SetIsolation(ctx, "ns", "web", true, true); err != nil {
		t.Fatal(err)
	}
	d := podFlows()
	if !bit(d, "24") || !bit(d, "25") {
		t.Errorf("after isolating for both:\n%s", d)
	}
	// Meter 5, as recorded; 1 Mbit/s: 1,100 kbps, twice a 64 KiB bucket.
	if ms := h.meters(); len(ms) != 1 || ms[0] != "meter=5 kbps burst stats bands=type=drop rate=1100 burst_size=1049" {
		t.Errorf("meters after the restore: %q", ms)
	}
	if !strings.Contains(d, "actions=meter:5,") {
		t.Errorf("the isolated Classifier flow does not go through meter 5:\n%s", d)
	}
	t.Logf("isolated Pod flows:\n%s", d)
	if err := be.SetIsolation(ctx, "ns", "other", true, true); err != nil {
		t.Errorf("unknown Pod: %v", err)
	}

	// DEL removes the flows and the record: a late call installs nothing.
	if err := be.Del(ctx, &cniserver.Request{ContainerID: cid, IfName: ifn}); err != nil {
		t.Fatalf("Del: %v", err)
	}
	if err := be.SetIsolation(ctx, "ns", "web", false, false); err != nil {
		t.Fatal(err)
	}
	if d := podFlows(); d != "" {
		t.Errorf("flows of a released Pod:\n%s", d)
	}
	if ms := h.meters(); len(ms) != 0 {
		t.Errorf("meters of a released Pod: %q", ms)
	}
}

// restoreLimitedPod makes a Pod port on h's bridge as a daemon restart
// finds it (a veth with a unique name, its peer standing for the Pod's
// end, ns/web at 10.244.1.5 with an egress limit through meter 5) and
// restores it. It returns the Pod's container ID and interface name.
func restoreLimitedPod(ctx context.Context, h *harness) (cid, ifn string) {
	t := h.t
	t.Helper()
	h.be.cfg.Meters = h.of
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	cid, ifn = "c0ffee"+hex.EncodeToString(b), "eth0"
	link := HostVethName(cid, ifn)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: "svp" + hex.EncodeToString(b)}); err != nil {
		t.Fatalf("creating %s: %v", link, err)
	}
	t.Cleanup(func() { _ = deleteLink(link) })
	h.addPort(ctx, link, "set", "port", link,
		"external_ids:"+ExtIDContainerID+"="+cid, "external_ids:"+ExtIDIfName+"="+ifn,
		"external_ids:"+ExtIDPodNamespace+"=ns", "external_ids:"+ExtIDPodName+"=web",
		"external_ids:"+ExtIDIP+"=10.244.1.5", "external_ids:"+ExtIDMAC+"=0a:58:0a:f4:01:05",
		"external_ids:"+ExtIDEgressBandwidth+"=1000000/0", "external_ids:"+ExtIDEgressMeter+"=5")
	if n, err := h.be.RestorePods(ctx); err != nil || n != 1 {
		t.Fatalf("RestorePods = %d, %v; want 1 Pod", n, err)
	}
	return cid, ifn
}

// isolationFlows returns the Classifier (in_port) and L2Forwarding
// (table 80) flows of h's Pods, by the cookie category of Pod flows.
func isolationFlows(h *harness) string {
	pod := "cookie=0x20000000000/0xff0000000000"
	out := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"), pod)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "priority=190,in_port=") || strings.Contains(l, "table=80,") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

// delFirst runs del before the first Set that installs flows: a DEL that
// lands while SetIsolation's flows travel.
type delFirst struct {
	Flows
	once sync.Once
	del  func()
}

func (d *delFirst) Set(ctx context.Context, owner string, flows []of.Flow) error {
	if len(flows) > 0 {
		d.once.Do(d.del)
	}
	return d.Flows.Set(ctx, owner, flows)
}

// TestSetIsolationRacingDel lets a Pod's DEL land while SetIsolation's
// flows travel: the DEL has removed the Pod's egress meter, so the switch
// refuses the flows. SetIsolation reports no error (the Pod is gone, there
// is nothing to retry) and leaves no flow or meter of the Pod behind.
func TestSetIsolationRacingDel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	cid, ifn := restoreLimitedPod(ctx, h)
	var delErr error
	h.be.flows = &delFirst{Flows: h.flows, del: func() {
		delErr = h.be.Del(ctx, &cniserver.Request{ContainerID: cid, IfName: ifn})
	}}
	if err := h.be.SetIsolation(ctx, "ns", "web", true, true); err != nil {
		t.Errorf("SetIsolation of a Pod detached meanwhile: %v", err)
	}
	if delErr != nil {
		t.Fatalf("Del: %v", delErr)
	}
	if d := isolationFlows(h); d != "" {
		t.Errorf("flows of a released Pod:\n%s", d)
	}
	if h.flows.Has(owner(cid, ifn)) {
		t.Errorf("the released Pod's flows are still desired")
	}
	if ms := h.meters(); len(ms) != 0 {
		t.Errorf("meters of a released Pod: %q", ms)
	}
}

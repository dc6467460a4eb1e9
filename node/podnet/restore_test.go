package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/ipam"
)

// A restarted daemon restores the Pods it can and never takes a live Pod's
// network away: a Pod whose veth exists but whose port ovs-vswitchd could
// not open (ofport -1) keeps its veth, port and address (a chained one its
// port, rather than leave its NetworkPolicies), while a Pod beside it is
// restored, and a port whose veth is gone is released.
func TestRestoreKeepsLivePodWithoutOFPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	suffix := func() string {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	ids := func(ip, mac string) map[string]string {
		return map[string]string{ExtIDPodNamespace: "ns", ExtIDIP: ip, ExtIDMAC: mac}
	}
	// A healthy Pod.
	okID := h.prefix + "-ok"
	h.podPort(ctx, okID, "rkp"+suffix(), ids("10.244.1.7", "0a:58:0a:f4:01:07"))

	// A live Pod whose port ovs-vswitchd cannot open: its interface type
	// is one ovs-vswitchd does not know.
	badID := h.prefix + "-bad"
	h.ids = append(h.ids, badID)
	bad := HostVethName(badID, "eth0")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: bad}, PeerName: "rkb" + suffix()}); err != nil {
		t.Fatalf("creating %s: %v", bad, err)
	}
	t.Cleanup(func() { _ = deleteLink(bad) })
	h.ovs.Run("ovs-vsctl", "add-port", "br-int", bad, "--", "set", "interface", bad, "type=seine-test-unknown",
		"--", "set", "port", bad, "external_ids:"+ExtIDContainerID+"="+badID, "external_ids:"+ExtIDIfName+"=eth0",
		"external_ids:"+ExtIDPodNamespace+"=ns", "external_ids:"+ExtIDPodName+"=bad",
		"external_ids:"+ExtIDIP+"=10.244.1.8", "external_ids:"+ExtIDMAC+"=0a:58:0a:f4:01:08")
	if err := h.ipam.Claim(ipam.Owner{ContainerID: badID, IfName: "eth0", Namespace: "ns", Pod: "bad"}, []byte{10, 244, 1, 8}); err != nil {
		t.Fatal(err)
	}

	// A chained Pod (networkPolicyOnly) whose port ovs-vswitchd cannot
	// open: it stays attached rather than run outside its policies.
	chainedID := h.prefix + "-chained"
	h.ids = append(h.ids, chainedID)
	chained := HostVethName(chainedID, "eth0")
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: chained}, PeerName: "rkc" + suffix()}); err != nil {
		t.Fatalf("creating %s: %v", chained, err)
	}
	t.Cleanup(func() { _ = deleteLink(chained) })
	h.ovs.Run("ovs-vsctl", "add-port", "br-int", chained, "--", "set", "interface", chained, "type=seine-test-unknown",
		"--", "set", "port", chained, "external_ids:"+ExtIDContainerID+"="+chainedID, "external_ids:"+ExtIDIfName+"=eth0",
		"external_ids:"+ExtIDAttachment+"="+AttachmentChained, "external_ids:"+ExtIDPodNamespace+"=ns",
		"external_ids:"+ExtIDPodName+"=chained", "external_ids:"+ExtIDIP+"=10.244.1.10", "external_ids:"+ExtIDMAC+"=0a:58:0a:f4:01:0a")
	for _, name := range []string{bad, chained} {
		for {
			if p, err := h.db.GetPort(ctx, name); err == nil && p != nil && p.OFPort < 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("port %s never got ofport -1", name)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}

	// A Pod whose veth went while the daemon was down.
	goneID := h.prefix + "-gone"
	gone := h.podPort(ctx, goneID, "rkg"+suffix(), ids("10.244.1.9", "0a:58:0a:f4:01:09"))
	if err := deleteLink(gone); err != nil {
		t.Fatal(err)
	}

	n, err := h.be.RestorePods(ctx)
	if err != nil || n != 1 {
		t.Fatalf("RestorePods = %d, %v; want the healthy Pod restored and no error", n, err)
	}
	if _, err := netlink.LinkByName(bad); err != nil {
		t.Errorf("the live Pod's veth %s was deleted: %v", bad, err)
	}
	if ip, ok := h.ipam.Lookup(badID, "eth0"); !ok || ip.String() != "10.244.1.8" {
		t.Errorf("the live Pod's address was released: %v %v", ip, ok)
	}
	if p, err := h.db.GetPort(ctx, bad); err != nil || p == nil {
		t.Errorf("the live Pod's port was removed: %v", err)
	}
	if p, err := h.db.GetPort(ctx, chained); err != nil || p == nil {
		t.Errorf("the live chained Pod's port was removed: %v", err)
	}
	if ip, ok := h.ipam.Lookup(okID, "eth0"); !ok || ip.String() != "10.244.1.7" {
		t.Errorf("the healthy Pod's address is not held: %v %v", ip, ok)
	}
	if p, err := h.db.GetPort(ctx, gone); err != nil || p != nil {
		t.Errorf("the port of the Pod whose veth is gone is still there: %+v, %v", p, err)
	}
}

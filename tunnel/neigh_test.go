package tunnel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/tests/netnstest"
)

// recordingAppctl records the commands it is given and answers "".
type recordingAppctl struct{ calls []string }

func (r *recordingAppctl) Run(_ context.Context, method string, params ...string) (string, error) {
	r.calls = append(r.calls, strings.Join(append([]string{method}, params...), " "))
	return "", nil
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// TestNeighborsEnsure runs in a fresh network namespace wired by a veth to
// a peer namespace: an on-link peer resolves to its own MAC, a peer behind
// a gateway to the gateway's, and a silent or unroutable peer is an error
// naming the cause. The OVS command is recorded, not sent: the kernel side
// is what is under test here (tests/e2e checks the cache of real Nodes).
func TestNeighborsEnsure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	peerNS := "seine-tnl-" + hex.EncodeToString(b)
	ipCmd(t, "netns", "add", peerNS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", peerNS).Run() })

	netnstest.Run(t, func() { neighborsInNetns(t, peerNS) })
}

func neighborsInNetns(t *testing.T, peerNS string) {
	ipCmd(t, "link", "add", "tn0", "type", "veth", "peer", "name", "tn1", "netns", peerNS)
	ipCmd(t, "addr", "add", "198.19.251.1/24", "dev", "tn0")
	ipCmd(t, "link", "set", "tn0", "up")
	ipCmd(t, "-n", peerNS, "addr", "add", "198.19.251.2/24", "dev", "tn1")
	ipCmd(t, "-n", peerNS, "link", "set", "tn1", "up")
	ipCmd(t, "route", "add", "198.19.252.0/24", "via", "198.19.251.2")
	out, err := exec.Command("ip", "-n", peerNS, "-br", "link", "show", "tn1").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	peerMAC := strings.Fields(string(out))[2]
	if _, err := net.ParseMAC(peerMAC); err != nil {
		t.Fatalf("peer MAC %q: %v", peerMAC, err)
	}

	rec := &recordingAppctl{}
	n := &Neighbors{Bridge: "br-phy", Appctl: rec, Wait: 500 * time.Millisecond}
	ctx := context.Background()
	if err := n.Ensure(ctx, net.ParseIP("198.19.251.2")); err != nil {
		t.Fatalf("on-link peer: %v", err)
	}
	if err := n.Ensure(ctx, net.ParseIP("198.19.252.7")); err != nil {
		t.Fatalf("peer behind a gateway: %v", err)
	}
	want := []string{
		"tnl/neigh/set br-phy 198.19.251.2 " + peerMAC,
		"tnl/neigh/set br-phy 198.19.251.2 " + peerMAC,
	}
	if strings.Join(rec.calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(rec.calls, "\n"), strings.Join(want, "\n"))
	}

	err = n.Ensure(ctx, net.ParseIP("198.19.251.9"))
	if err == nil || !strings.Contains(err.Error(), "was not confirmed by ARP") {
		t.Errorf("silent peer: %v", err)
	}
	err = n.Ensure(ctx, net.ParseIP("198.18.200.1"))
	if err == nil || !strings.Contains(err.Error(), "route to tunnel peer 198.18.200.1") {
		t.Errorf("unroutable peer: %v", err)
	}
	if len(rec.calls) != 2 {
		t.Errorf("failed lookups still sent commands: %v", rec.calls[2:])
	}
	// The kernel entry exists, so the resolution was the kernel's.
	neighs, _ := netlink.NeighList(0, netlink.FAMILY_V4)
	found := false
	for _, e := range neighs {
		found = found || (e.IP.Equal(net.ParseIP("198.19.251.2")) && e.HardwareAddr.String() == peerMAC)
	}
	if !found {
		t.Errorf("no kernel neighbor entry for the peer: %v", neighs)
	}

	// An unconfirmed (STALE) entry may hold an old MAC: it is not written.
	ipCmd(t, "neigh", "replace", "198.19.251.2", "dev", "tn0", "lladdr", "02:00:00:00:00:99", "nud", "stale")
	if err := n.Ensure(ctx, net.ParseIP("198.19.251.2")); err == nil {
		t.Error("a STALE neighbor entry was taken as confirmed")
	}
	for _, c := range rec.calls {
		if strings.Contains(c, "02:00:00:00:00:99") {
			t.Errorf("the stale MAC was written: %s", c)
		}
	}
}

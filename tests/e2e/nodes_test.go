package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tunnel"
)

// TestNodeDeletionRemovesPeerState adds a Node object (no real host behind
// it: only its podCIDR and InternalIP matter to peers), waits until every
// Node has its flow and host route (and, through a kernel VXLAN device,
// its forwarding entry), deletes it, and checks all are gone everywhere. The ghost's address is in the first transport subnet: the
// Nodes there route to it directly in noEncap and hybrid, the others
// through the tunnel (hybrid) or the underlay (noEncap: a flow, no route).
func TestNodeDeletionRemovesPeerState(t *testing.T) {
	requireMode(t, config.ModeEncap, config.ModeNoEncap, config.ModeHybrid) // no peer state in networkPolicyOnly
	c := shared
	ctx := testCtx(t, 2*time.Minute)
	const ghostIP = "198.18.0.99"
	ghost := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ghost"},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.250.0/24", PodCIDRs: []string{"10.244.250.0/24"}},
	}
	created, err := c.Client().CoreV1().Nodes().Create(ctx, ghost, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Nodes().Delete(ctx, "ghost", metav1.DeleteOptions{}) })
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := c.Client().CoreV1().Nodes().Get(ctx, "ghost", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ghostIP}}
		_, err = c.Client().CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	podCIDR := created.Spec.PodCIDR
	// How a tunnelled peer's flows name it: its tun_dst (OVS's tunnel
	// port), or its own inner destination MAC, which the kernel VXLAN
	// device's forwarding database maps to its Node IP.
	kernelDevice := tunnel.Choose(true, sandboxTunnel) == tunnel.KindKernelDevice
	peerMark := ghostIP + "->tun_dst"
	if kernelDevice {
		peerMark = "set_field:" + pipeline.PeerMAC(net.ParseIP(ghostIP)).String() + "->eth_dst"
	}
	present := func(want bool) func() error {
		return func() error {
			for _, n := range c.Nodes() {
				direct := e2eMode.RoutesDirectly() && n.Subnet == 0
				tunnelled := e2eMode == config.ModeEncap || e2eMode == config.ModeHybrid && !direct
				flows := ovs(t, n, "ovs-ofctl", "dump-flows", brInt(n))
				hasFlow := strings.Contains(flows, "nw_dst="+podCIDR) && strings.Contains(flows, peerMark) == tunnelled
				if kernelDevice && e2eMode.UsesTunnel() {
					fdb, err := c.NodeExec(ctx, n.Name, "bridge", "fdb", "show", "dev", "seine-tun0")
					if err != nil {
						return fmt.Errorf("forwarding database of %s: %v: %s", n.Name, err, fdb)
					}
					if has := strings.Contains(string(fdb), "dst "+ghostIP+" "); has != (want && tunnelled) {
						return fmt.Errorf("on %s: forwarding entry for %s %v, want %v:\n%s", n.Name, ghostIP, has, want && tunnelled, fdb)
					}
				}
				out, err := c.NodeExec(ctx, n.Name, "ip", "route", "show", podCIDR)
				if err != nil {
					return err
				}
				hasRoute := tunnelled && strings.Contains(string(out), "seine-gw0") ||
					direct && strings.Contains(string(out), "via "+ghostIP) ||
					!tunnelled && !direct && strings.TrimSpace(string(out)) == ""
				if !want {
					hasRoute = strings.TrimSpace(string(out)) != ""
				}
				if hasFlow != want || hasRoute != want {
					return fmt.Errorf("on %s: flow %v, route %v, want %v (tunnel %v, direct %v)\n%s", n.Name, hasFlow, hasRoute, want, tunnelled, direct, out)
				}
			}
			return nil
		}
	}
	eventually(t, 20*time.Second, "peer state for the new Node", present(true))
	if err := c.Client().CoreV1().Nodes().Delete(ctx, "ghost", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "peer state removed after Node deletion", present(false))
}

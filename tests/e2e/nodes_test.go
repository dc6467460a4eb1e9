package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/seine-net/seine/node/config"
)

// TestNodeDeletionRemovesPeerState adds a Node object (no real host behind
// it: only its podCIDR and InternalIP matter to peers), waits until every
// Node has its flow and host route, deletes it, and checks both are gone
// everywhere. The ghost's address is in the first transport subnet: the
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
	present := func(want bool) func() error {
		return func() error {
			for _, n := range c.Nodes() {
				direct := e2eMode.RoutesDirectly() && n.Subnet == 0
				tunnel := e2eMode == config.ModeEncap || e2eMode == config.ModeHybrid && !direct
				flows := ovs(t, n, "ovs-ofctl", "dump-flows", brInt(n))
				hasFlow := strings.Contains(flows, "nw_dst="+podCIDR) && strings.Contains(flows, ghostIP+"->tun_dst") == tunnel
				out, err := c.NodeExec(ctx, n.Name, "ip", "route", "show", podCIDR)
				if err != nil {
					return err
				}
				hasRoute := tunnel && strings.Contains(string(out), "seine-gw0") ||
					direct && strings.Contains(string(out), "via "+ghostIP) ||
					!tunnel && !direct && strings.TrimSpace(string(out)) == ""
				if !want {
					hasRoute = strings.TrimSpace(string(out)) != ""
				}
				if hasFlow != want || hasRoute != want {
					return fmt.Errorf("on %s: flow %v, route %v, want %v (tunnel %v, direct %v)\n%s", n.Name, hasFlow, hasRoute, want, tunnel, direct, out)
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

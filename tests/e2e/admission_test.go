package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpclient "github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/tests/sandbox"
)

// seineClients are the clients of one set of seine credentials.
type seineClients struct {
	kube kubernetes.Interface
	ops  opsclient.Interface
	cp   cpclient.Interface
}

func newSeineClients(t *testing.T, rc *rest.Config) seineClients {
	t.Helper()
	return seineClients{kubernetes.NewForConfigOrDie(rc), opsclient.NewForConfigOrDie(rc), cpclient.NewForConfigOrDie(rc)}
}

// nodeClients are the clients of node's seine daemon's credentials.
func nodeClients(t *testing.T, c *sandbox.Cluster, node string) seineClients {
	t.Helper()
	rc, err := c.SeineRESTConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	return newSeineClients(t, rc)
}

// dryRun writes nothing; admission runs all the same.
var dryRun = []string{metav1.DryRunAll}

// probeAddressGroup is a valid AddressGroup no computation produces.
func probeAddressGroup() *cpv1alpha1.AddressGroup {
	return &cpv1alpha1.AddressGroup{ObjectMeta: metav1.ObjectMeta{Name: "e2e-admission-probe"},
		Spec: cpv1alpha1.AddressGroupSpec{Selector: cpv1alpha1.GroupSelector{}}}
}

// wantRefused fails unless err is Forbidden by the named admission policy
// and its message holds every part of want.
func wantRefused(t *testing.T, what string, err error, policy string, want ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: err = %v, want Forbidden by %s", what, err, policy)
		return
	}
	for _, w := range append([]string{"ValidatingAdmissionPolicy '" + policy + "'"}, want...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: refusal %q does not say %q", what, err, w)
		}
	}
}

// TestSeineWritesOnlyWhatItsNodeMay: the manifest's admission policies
// narrow the one ServiceAccount every seine shares. With its token bound
// to its Node, an instance claims the controller's Lease and the
// ControllerInfo only in its own name, writes only its own AgentInfo (the
// leader still deletes a gone Node's), and writes the computed policy
// state only while the ControllerInfo names its Node; a token bound to no
// Node writes nothing. Every write is a dry run: admission runs, nothing
// is stored.
func TestSeineWritesOnlyWhatItsNodeMay(t *testing.T) {
	c := shared
	ctx := testCtx(t, time.Minute)
	holder := leaseHolder(t, c)
	if holder == "" {
		t.Fatal("no instance holds the controller Lease")
	}
	other := ""
	for _, n := range c.Nodes() {
		if n.Name != holder {
			other = n.Name
			break
		}
	}
	if other == "" {
		t.Skip("one Node: no instance other than the leader")
	}
	leader, follower := nodeClients(t, c, holder), nodeClients(t, c, other)
	const policy = "seine-node-identity"
	// Each daemon checked its credentials at start-up and found them
	// bound to its Node (node/agent checkIdentity).
	for _, n := range c.Nodes() {
		b, err := os.ReadFile(n.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "these credentials cannot write as this Node") || !strings.Contains(string(b), "credentials checked") {
			t.Errorf("seine on %s did not find its credentials bound to its Node; its log:\n%s", n.Name, grepLines(string(b), "credentials"))
		}
	}

	// The Lease: claimed in one's own name only. (Dry-run creations of a
	// probe Lease: admission runs before the store would find a conflict,
	// which an update racing the leader's renewals every 2 s could.)
	leaseNamed := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: sandbox.SeineNamespace, Name: "e2e-admission-probe"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &name}}
	}
	_, err := follower.kube.CoordinationV1().Leases(sandbox.SeineNamespace).Create(ctx, leaseNamed(holder), metav1.CreateOptions{DryRun: dryRun})
	wantRefused(t, "a follower writing the Lease in the leader's name", err, policy, "Node "+other, "not as "+holder)
	if _, err := follower.kube.CoordinationV1().Leases(sandbox.SeineNamespace).Create(ctx, leaseNamed(other), metav1.CreateOptions{DryRun: dryRun}); err != nil {
		t.Errorf("a follower writing the Lease in its own name (as a candidate does when it lapses): %v", err)
	}

	// AgentInfos: one's own only; the leader removes a gone Node's.
	ops, _ := opsClients(t, c)
	for _, n := range []string{holder, other} {
		ai, err := ops.OpsV1alpha1().AgentInfos().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = follower.ops.OpsV1alpha1().AgentInfos().Update(ctx, ai, metav1.UpdateOptions{DryRun: dryRun})
		if n == other && err != nil {
			t.Errorf("%s updating its own AgentInfo: %v", other, err)
		}
		if n == holder {
			wantRefused(t, "a follower updating the leader's AgentInfo", err, policy, "not "+holder)
		}
	}
	if err := leader.ops.OpsV1alpha1().AgentInfos().Delete(ctx, other, metav1.DeleteOptions{DryRun: dryRun}); err != nil {
		t.Errorf("the leader deleting another Node's AgentInfo: %v", err)
	}
	err = follower.ops.OpsV1alpha1().AgentInfos().Delete(ctx, holder, metav1.DeleteOptions{DryRun: dryRun})
	wantRefused(t, "a follower deleting the leader's AgentInfo", err, "seine-leader-writes", "names "+holder)
	// The realization annotations on NetworkPolicies: the leader's.
	ns := "admission"
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	np := allowFrom(ns, "annotated", map[string]string{"app": "none"}, map[string]string{"app": "none"})
	if _, err := c.Client().NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	annotate := []byte(`{"metadata":{"annotations":{"seine.io/realized-nodes":"0/0"}}}`)
	_, err = follower.kube.NetworkingV1().NetworkPolicies(ns).Patch(ctx, np.Name, types.MergePatchType, annotate, metav1.PatchOptions{DryRun: dryRun})
	wantRefused(t, "a follower annotating a NetworkPolicy", err, "seine-leader-writes", "names "+holder)
	if _, err := leader.kube.NetworkingV1().NetworkPolicies(ns).Patch(ctx, np.Name, types.MergePatchType, annotate, metav1.PatchOptions{DryRun: dryRun}); err != nil {
		t.Errorf("the leader annotating a NetworkPolicy: %v", err)
	}

	// The computed state: from the Node the ControllerInfo names (the
	// leader claimed it) only; the refusal names both Nodes.
	if err := writeComputedState(t, c, holder); err != nil {
		t.Errorf("the leader creating an AddressGroup: %v", err)
	}
	wantRefused(t, "a follower creating an AddressGroup", writeComputedState(t, c, other), "seine-leader-writes",
		"the ControllerInfo seine-controller names "+holder, "this request comes from Node "+other)
	ci, err := ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = follower.ops.OpsV1alpha1().ControllerInfos().Update(ctx, ci, metav1.UpdateOptions{DryRun: dryRun})
	wantRefused(t, "a follower writing the ControllerInfo in the leader's name", err, policy, "Node "+other, "not as "+holder)

	// A token bound to no Node (a legacy Secret's, or one requested
	// without a binding) writes nothing, not even as a candidate.
	path := filepath.Join(t.TempDir(), "unbound.kubeconfig")
	if err := c.ControlPlane().ServiceAccountKubeconfig(ctx, sandbox.SeineNamespace, "seine", "", path); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ControlPlane().ConfigFromKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	unbound := newSeineClients(t, rc)
	// (Both policies refuse it; either may answer.)
	_, err = unbound.cp.ControlplaneV1alpha1().AddressGroups().Create(ctx, probeAddressGroup(), metav1.CreateOptions{DryRun: dryRun})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no Node") {
		t.Errorf("an unbound token creating an AddressGroup: err = %v, want Forbidden for a token bound to no Node", err)
	}
	_, err = unbound.kube.CoordinationV1().Leases(sandbox.SeineNamespace).Create(ctx, leaseNamed(other), metav1.CreateOptions{DryRun: dryRun})
	wantRefused(t, "an unbound token writing the Lease", err, policy, "names no Node")
}

// writeComputedState makes a dry-run write of the computed state with
// node's seine credentials and returns its error: nil while the
// ControllerInfo names the Node, Forbidden otherwise (the fence of a
// deposed leader).
func writeComputedState(t *testing.T, c *sandbox.Cluster, node string) error {
	t.Helper()
	cl := nodeClients(t, c, node)
	_, err := cl.cp.ControlplaneV1alpha1().AddressGroups().Create(testCtx(t, 10*time.Second), probeAddressGroup(), metav1.CreateOptions{DryRun: dryRun})
	return err
}

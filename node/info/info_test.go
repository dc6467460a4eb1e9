package info

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpclient "github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/policy/compute"
	policycontroller "github.com/seine-net/seine/policy/controller"
	"github.com/seine-net/seine/tests/apienv"
)

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	eventuallyFor(t, 30*time.Second, what, cond)
}

func eventuallyFor(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nextWrite returns the object of w's first event, which must be a
// modification, and stops w; it fails the test when none comes within d.
// Open w at the resourceVersion last read, so that the event is the next
// write after that read.
func nextWrite(t *testing.T, w watch.Interface, d time.Duration) runtime.Object {
	t.Helper()
	defer w.Stop()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch closed before any write")
		}
		if ev.Type != watch.Modified {
			t.Fatalf("next event %s, want %s: %+v", ev.Type, watch.Modified, ev.Object)
		}
		return ev.Object
	case <-time.After(d):
		t.Fatalf("no write within %s", d)
	}
	return nil
}

type clients struct {
	kube kubernetes.Interface
	cp   cpclient.Interface
	ops  opsclient.Interface
}

func start(t *testing.T) (*clients, context.Context) {
	rc := apienv.Start(t, "../../deploy/crds")
	c := &clients{kube: kubernetes.NewForConfigOrDie(rc), cp: cpclient.NewForConfigOrDie(rc), ops: opsclient.NewForConfigOrDie(rc)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return c, ctx
}

func createNode(t *testing.T, ctx context.Context, c *clients, name string) *corev1.Node {
	n, err := c.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The daemon's AgentInfo appears at once, owned by its Node, follows a
// change of a figure within the check period, keeps a condition's
// transition time while it holds, and beats every Heartbeat.
func TestAgentInfoWriter(t *testing.T) {
	c, ctx := start(t)
	node := createNode(t, ctx, c, "n1")
	var pods atomic.Int32
	pods.Store(3)
	started := metav1.Now() // nanoseconds: the API server keeps seconds
	status := func(context.Context) (opsv1alpha1.AgentInfoStatus, error) {
		return opsv1alpha1.AgentInfoStatus{Version: "v-test", PodCount: pods.Load(), LastHeartbeatTime: metav1.Now(), StartTime: started,
			Conditions: []metav1.Condition{{Type: opsv1alpha1.AgentReady, Status: metav1.ConditionTrue, Reason: "Ready"}}}, nil
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- RunAgent(runCtx, c.ops, AgentConfig{NodeName: "n1", NodeUID: node.UID, Status: status,
			Heartbeat: 3 * time.Second, Check: 100 * time.Millisecond}, zaptest.NewLogger(t))
	}()
	t.Cleanup(func() { stop(); <-done })
	get := func() (*opsv1alpha1.AgentInfo, error) {
		return c.ops.OpsV1alpha1().AgentInfos().Get(ctx, "n1", metav1.GetOptions{})
	}
	var first *opsv1alpha1.AgentInfo
	eventually(t, "AgentInfo written", func() error {
		ai, err := get()
		if err != nil {
			return err
		}
		if ai.Status.PodCount != 3 || len(ai.OwnerReferences) != 1 || ai.OwnerReferences[0].UID != node.UID {
			return fmt.Errorf("status %+v owners %+v", ai.Status, ai.OwnerReferences)
		}
		if meta.FindStatusCondition(ai.Status.Conditions, opsv1alpha1.AgentAPIConnected) == nil {
			return fmt.Errorf("no APIConnected condition: %+v", ai.Status.Conditions)
		}
		first = ai
		return nil
	})
	pods.Store(4)
	var changed *opsv1alpha1.AgentInfo
	eventually(t, "pod count change written", func() error {
		ai, err := get()
		if err != nil {
			return err
		}
		if ai.Status.PodCount != 4 {
			return fmt.Errorf("podCount %d", ai.Status.PodCount)
		}
		changed = ai
		return nil
	})
	// Nothing changes now, so the next write must be the heartbeat, which
	// the writer owes Heartbeat (3 s) after its last write: a rewrite
	// without a change would come at the next check, 100 ms on.
	w, err := c.ops.OpsV1alpha1().AgentInfos().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=n1",
		ResourceVersion: changed.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	beat := nextWrite(t, w, 30*time.Second).(*opsv1alpha1.AgentInfo)
	if gap := beat.Status.LastHeartbeatTime.Sub(changed.Status.LastHeartbeatTime.Time); gap < 3*time.Second {
		t.Errorf("AgentInfo rewritten %s after the change without a change of its own (heartbeat every 3 s): %+v", gap, beat.Status)
	}
	was := meta.FindStatusCondition(first.Status.Conditions, opsv1alpha1.AgentReady).LastTransitionTime
	if now := meta.FindStatusCondition(beat.Status.Conditions, opsv1alpha1.AgentReady).LastTransitionTime; !now.Equal(&was) {
		t.Errorf("Ready's transition time moved from %v to %v while it held", was, now)
	}
	// The Node goes: the garbage collector removes its AgentInfo (the
	// owner reference).
	stop()
	<-done
	done <- nil // for the cleanup
	if err := c.kube.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The collector builds its graph of owners first, which takes a
	// while on a fresh control plane.
	eventuallyFor(t, 2*time.Minute, "AgentInfo collected with its Node", func() error {
		if _, err := get(); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// The leader writes the ControllerInfo, deletes AgentInfos without a
// Node, and annotates NetworkPolicies with the Nodes of their span that
// realized their generation.
func TestLeaderTasks(t *testing.T) {
	c, ctx := start(t)
	for _, n := range []string{"n1", "n2"} {
		createNode(t, ctx, c, n)
	}
	since := time.Now().Add(-time.Minute) // nanoseconds: the API server keeps seconds
	finished := time.Now()
	var observed atomic.Value // the Lease holder the controller last read
	observed.Store("n1")
	status := func() policycontroller.Status {
		return policycontroller.Status{Leading: true, Observed: observed.Load().(string), Since: since, Sources: map[string]int{"pods": 7, "nodes": 2},
			Computed: map[compute.Kind]int{compute.KindNetworkPolicy: 1}, InitialSync: 1500 * time.Millisecond,
			LastRound: &policycontroller.Round{FinishedAt: finished, Duration: 40 * time.Millisecond, Objects: 3}}
	}
	np, err := c.kube.NetworkingV1().NetworkPolicies("default").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := "np-" + string(np.UID)
	_, err = c.cp.ControlplaneV1alpha1().NetworkPolicies().Create(ctx, &cpv1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{cpv1alpha1.SpanLabel("n1"): "", cpv1alpha1.SpanLabel("n2"): ""}},
		Spec: cpv1alpha1.NetworkPolicySpec{Source: cpv1alpha1.PolicyReference{Namespace: "default", Name: "web", UID: string(np.UID),
			Generation: np.Generation}, AppliedToGroup: "g", PolicyTypes: []string{"Ingress"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent := func(node string, realized map[string]int64) {
		t.Helper()
		ai := &opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: opsv1alpha1.AgentInfoStatus{RealizedPolicies: realized}}
		cur, err := c.ops.OpsV1alpha1().AgentInfos().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = c.ops.OpsV1alpha1().AgentInfos().Create(ctx, ai, metav1.CreateOptions{})
		} else if err == nil {
			ai.ResourceVersion = cur.ResourceVersion
			_, err = c.ops.OpsV1alpha1().AgentInfos().Update(ctx, ai, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	agent("n1", map[string]int64{name: np.Generation})
	agent("n2", map[string]int64{name: np.Generation - 1})
	agent("ghost", nil)

	l := NewLeader(c.kube, c.cp, c.ops, LeaderConfig{Identity: "n1", Name: "seine-controller", Status: status,
		Heartbeat: 6 * time.Second, Check: 100 * time.Millisecond, Debounce: 50 * time.Millisecond}, zaptest.NewLogger(t))
	runCtx, stop := context.WithCancel(ctx)
	for _, task := range l.Tasks() {
		go task(runCtx)
	}
	t.Cleanup(stop)

	eventually(t, "ControllerInfo", func() error {
		ci, err := c.ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ci.Status
		if s.Leader != "n1" || !s.LeaderSince.Time.Equal(since.Truncate(time.Second)) || s.Sources.Pods != 7 || s.Computed.NetworkPolicies != 1 ||
			s.LastComputation == nil || s.LastComputation.Objects != 3 || s.InitialSyncDuration.Duration != 1500*time.Millisecond {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	// Nothing changes, so the next write must be the heartbeat, 6 s after
	// the last write: a rewrite without a change would come at the next
	// check, 100 ms on.
	ci, err := c.ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.ops.OpsV1alpha1().ControllerInfos().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=seine-controller",
		ResourceVersion: ci.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	beat := nextWrite(t, w, 30*time.Second).(*opsv1alpha1.ControllerInfo)
	if gap := beat.Status.LastHeartbeatTime.Sub(ci.Status.LastHeartbeatTime.Time); gap < 6*time.Second {
		t.Errorf("ControllerInfo rewritten %s after the last write without a change (heartbeat every 6 s): %+v", gap, beat.Status)
	}
	// The ControllerInfo is the term's claim (the manifest's admission
	// policy admits the computed state only from the Node it names): one
	// a deposed leader wrote over it is claimed back at the next check...
	claim := func(leader string) {
		t.Helper()
		cur, err := c.ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Leader = leader
		if _, err := c.ops.OpsV1alpha1().ControllerInfos().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	named := func(want string) func() error {
		return func() error {
			ci, err := c.ops.OpsV1alpha1().ControllerInfos().Get(ctx, "seine-controller", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ci.Status.Leader != want {
				return fmt.Errorf("the ControllerInfo names %q, want %q", ci.Status.Leader, want)
			}
			return nil
		}
	}
	claim("n2")
	// Within 2 s of the heartbeat above, so well before the next one
	// (6 s): the check claimed it back, not the heartbeat.
	eventuallyFor(t, 2*time.Second, "ControllerInfo claimed back", named("n1"))
	// ... but not by a leader whose latest read of the Lease names
	// another: it is the deposed one. Ten checks pass without a write.
	observed.Store("n2")
	claim("n2")
	time.Sleep(10 * 100 * time.Millisecond)
	if err := named("n2")(); err != nil {
		t.Errorf("a deposed leader claimed the ControllerInfo back: %v", err)
	}
	observed.Store("n1")
	eventually(t, "ControllerInfo claimed back once the Lease names the leader again", named("n1"))
	// A deleted one is written again at the next check, not at the
	// heartbeat: until then the policy refuses every write of the leader.
	if err := c.ops.OpsV1alpha1().ControllerInfos().Delete(ctx, "seine-controller", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventuallyFor(t, 2*time.Second, "ControllerInfo written again after its deletion", named("n1"))

	eventually(t, "ghost AgentInfo deleted", func() error {
		if _, err := c.ops.OpsV1alpha1().AgentInfos().Get(ctx, "ghost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	annotated := func(want string) func() error {
		return func() error {
			cur, err := c.kube.NetworkingV1().NetworkPolicies("default").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := cur.Annotations[AnnotationRealizedNodes]; got != want ||
				cur.Annotations[AnnotationRealizedGeneration] != fmt.Sprint(cur.Generation) {
				return fmt.Errorf("annotations %v, want %s of generation %d", cur.Annotations, want, cur.Generation)
			}
			return nil
		}
	}
	eventually(t, "realization 1/2", annotated("1/2"))
	agent("n2", map[string]int64{name: np.Generation})
	eventually(t, "realization 2/2", annotated("2/2"))
	if _, err := c.ops.OpsV1alpha1().AgentInfos().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("the AgentInfo of an existing Node was touched: %v", err)
	}
}

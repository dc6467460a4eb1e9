package info

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	opsinformers "github.com/seine-net/seine/node/client/informers"
	"github.com/seine-net/seine/node/version"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpclient "github.com/seine-net/seine/policy/client/clientset/versioned"
	cpinformers "github.com/seine-net/seine/policy/client/informers"
	"github.com/seine-net/seine/policy/compute"
	policycontroller "github.com/seine-net/seine/policy/controller"
)

// Annotations the leader keeps on every networking.k8s.io NetworkPolicy.
const (
	// AnnotationRealizedNodes is "<realized>/<span>": of the Nodes with a
	// Pod the policy selects, how many run flows for its current
	// generation.
	AnnotationRealizedNodes = "seine.io/realized-nodes"
	// AnnotationRealizedGeneration is the metadata.generation the count
	// refers to.
	AnnotationRealizedGeneration = "seine.io/realized-generation"
)

// LeaderConfig configures the leader's tasks.
type LeaderConfig struct {
	// Identity is this instance's name in the Lease (the Node name);
	// Name names the ControllerInfo (the Lease's name).
	Identity, Name string
	// Status reports the policy controller's state.
	Status func() policycontroller.Status
	// Heartbeat and Check as in AgentConfig; Debounce delays the
	// realization annotations after a change (default 1 s).
	Heartbeat, Check, Debounce time.Duration
}

// Leader holds the tasks only the policy controller's leader runs.
type Leader struct {
	kube kubernetes.Interface
	cp   cpclient.Interface
	ops  opsclient.Interface
	cfg  LeaderConfig
	log  *zap.Logger
}

// NewLeader returns the leader's tasks.
func NewLeader(kube kubernetes.Interface, cp cpclient.Interface, ops opsclient.Interface, cfg LeaderConfig, log *zap.Logger) *Leader {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Check <= 0 {
		cfg.Check = DefaultCheck
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = time.Second
	}
	return &Leader{kube: kube, cp: cp, ops: ops, cfg: cfg, log: log}
}

// Tasks are the functions to run for each term
// (policycontroller.Controller.AddLeaderTask).
func (l *Leader) Tasks() []func(ctx context.Context) {
	return []func(ctx context.Context){l.runControllerInfo, l.runObservers}
}

// controllerStatus converts the controller's status; false unless this
// instance leads and its latest read of the Lease still names it (a
// deposed leader keeps its term until its renew deadline; from its first
// renewal after losing the Lease it must not claim the ControllerInfo
// back from its successor).
func (l *Leader) controllerStatus() (opsv1alpha1.ControllerInfoStatus, bool) {
	st := l.cfg.Status()
	if !st.Leading || st.Observed != l.cfg.Identity {
		return opsv1alpha1.ControllerInfoStatus{}, false
	}
	out := opsv1alpha1.ControllerInfoStatus{
		Leader:            l.cfg.Identity,
		LeaderSince:       metav1.NewTime(st.Since),
		LastHeartbeatTime: metav1.Now(),
		Version:           version.Version(),
		Sources: opsv1alpha1.SourceCounts{Namespaces: int32(st.Sources["namespaces"]), Pods: int32(st.Sources["pods"]),
			NetworkPolicies: int32(st.Sources["networkpolicies"]), Nodes: int32(st.Sources["nodes"])},
		Computed: opsv1alpha1.ComputedCounts{NetworkPolicies: int32(st.Computed[compute.KindNetworkPolicy]),
			AppliedToGroups: int32(st.Computed[compute.KindAppliedToGroup]), AddressGroups: int32(st.Computed[compute.KindAddressGroup]),
			PodRealizations: int32(st.Computed[compute.KindPodRealization])},
		QueueDepth:          int32(st.QueueDepth),
		InitialSyncDuration: metav1.Duration{Duration: st.InitialSync},
	}
	if r := st.LastRound; r != nil {
		out.LastComputation = &opsv1alpha1.Computation{FinishedAt: metav1.NewTime(r.FinishedAt),
			Duration: metav1.Duration{Duration: r.Duration}, Objects: int32(r.Objects)}
	}
	return out, true
}

// runControllerInfo writes the ControllerInfo while ctx lasts: at once,
// on every change of its figures (checked every Check) and at least every
// Heartbeat; and again whenever a Check finds it naming another leader.
// Writing it is also the term's claim: the manifest's admission policy
// seine-leader-writes admits the computed policy state only from the Node
// the ControllerInfo names, so a deposed leader's late writes are refused
// once its successor has written it.
func (l *Leader) runControllerInfo(ctx context.Context) {
	client := l.ops.OpsV1alpha1().ControllerInfos()
	var last *opsv1alpha1.ControllerInfo
	var sent opsv1alpha1.ControllerInfoStatus // as sent: full time precision
	var lastWrite time.Time
	strip := func(s opsv1alpha1.ControllerInfoStatus) opsv1alpha1.ControllerInfoStatus {
		s.LastHeartbeatTime = metav1.Time{}
		return s
	}
	t := time.NewTicker(l.cfg.Check)
	defer t.Stop()
	for {
		st, ok := l.controllerStatus()
		if ok && last != nil && l.claimLost(ctx, client) {
			last = nil
		}
		if ok && (last == nil || time.Since(lastWrite) >= l.cfg.Heartbeat || !reflect.DeepEqual(strip(st), strip(sent))) {
			got, err := l.writeControllerInfo(ctx, client, st, last)
			if err != nil {
				if ctx.Err() == nil {
					l.log.Warn("writing ControllerInfo failed; retrying", zap.Error(err))
				}
				last = nil
			} else {
				last, sent, lastWrite = got, st, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claimLost reports whether the stored ControllerInfo is gone or names a
// leader other than this instance (a deposed leader wrote it before its
// next renewal told it of its successor). Another failed read reports
// false: the next write finds out.
func (l *Leader) claimLost(ctx context.Context, client controllerInfoClient) bool {
	cur, err := client.Get(ctx, l.cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l.log.Warn("the ControllerInfo is gone; writing it again")
		return true
	case err != nil || cur.Status.Leader == l.cfg.Identity:
		return false
	}
	l.log.Warn("the ControllerInfo names another leader; claiming it again", zap.String("named", cur.Status.Leader))
	return true
}

type controllerInfoClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*opsv1alpha1.ControllerInfo, error)
	Create(ctx context.Context, o *opsv1alpha1.ControllerInfo, opts metav1.CreateOptions) (*opsv1alpha1.ControllerInfo, error)
	Update(ctx context.Context, o *opsv1alpha1.ControllerInfo, opts metav1.UpdateOptions) (*opsv1alpha1.ControllerInfo, error)
}

func (l *Leader) writeControllerInfo(ctx context.Context, client controllerInfoClient, st opsv1alpha1.ControllerInfoStatus,
	last *opsv1alpha1.ControllerInfo) (*opsv1alpha1.ControllerInfo, error) {
	want := &opsv1alpha1.ControllerInfo{ObjectMeta: metav1.ObjectMeta{Name: l.cfg.Name,
		Labels: map[string]string{"app.kubernetes.io/name": "seine"}}, Status: st}
	if last != nil {
		want.ResourceVersion = last.ResourceVersion
		if got, err := client.Update(ctx, want, metav1.UpdateOptions{}); err == nil {
			return got, nil
		}
	}
	cur, err := client.Get(ctx, l.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		want.ResourceVersion = ""
		return client.Create(ctx, want, metav1.CreateOptions{})
	}
	if err != nil {
		return nil, err
	}
	want.ResourceVersion = cur.ResourceVersion
	return client.Update(ctx, want, metav1.UpdateOptions{})
}

// runObservers watches Nodes, AgentInfos, NetworkPolicies and the computed
// NetworkPolicies for the term: it deletes the AgentInfos of Nodes that
// are gone and keeps the realization annotations current.
func (l *Leader) runObservers(ctx context.Context) {
	kf := informers.NewSharedInformerFactory(l.kube, 0)
	of := opsinformers.NewSharedInformerFactory(l.ops, 0)
	cf := cpinformers.NewSharedInformerFactory(l.cp, 0)
	nodes := kf.Core().V1().Nodes()
	nps := kf.Networking().V1().NetworkPolicies()
	agents := of.Ops().V1alpha1().AgentInfos()
	computed := cf.Controlplane().V1alpha1().NetworkPolicies()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}
	for _, inf := range []cache.SharedIndexInformer{nodes.Informer(), nps.Informer(), agents.Informer(), computed.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			l.log.Error("leader observers: event handler", zap.Error(err))
			return
		}
	}
	kf.Start(ctx.Done())
	of.Start(ctx.Done())
	cf.Start(ctx.Done())
	defer func() { kf.Shutdown(); of.Shutdown(); cf.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced, nps.Informer().HasSynced,
		agents.Informer().HasSynced, computed.Informer().HasSynced) {
		return
	}
	retry := time.NewTicker(30 * time.Second) // failed writes, and a backstop
	defer retry.Stop()
	for {
		l.deleteStaleAgentInfos(ctx, nodes.Lister().List, agents.Lister().List)
		l.annotateRealization(ctx, nps.Lister().List, computed.Lister().Get, agents.Lister().List)
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-retry.C:
		}
		select { // debounce a burst of events
		case <-ctx.Done():
			return
		case <-time.After(l.cfg.Debounce):
		}
	}
}

type lister[T any] func(labels.Selector) ([]T, error)

// deleteStaleAgentInfos deletes the AgentInfos whose Node does not exist
// (the garbage collector does it too, through the owner reference; this
// covers AgentInfos written without one).
func (l *Leader) deleteStaleAgentInfos(ctx context.Context, listNodes lister[*corev1.Node], listAgents lister[*opsv1alpha1.AgentInfo]) {
	ns, err := listNodes(labels.Everything())
	if err != nil {
		return
	}
	exists := map[string]bool{}
	for _, n := range ns {
		exists[n.Name] = true
	}
	ais, _ := listAgents(labels.Everything())
	for _, ai := range ais {
		if exists[ai.Name] {
			continue
		}
		err := l.ops.OpsV1alpha1().AgentInfos().Delete(ctx, ai.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &ai.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			l.log.Warn("deleting the AgentInfo of a removed Node", zap.String("agentinfo", ai.Name), zap.Error(err))
			continue
		}
		l.log.Info("deleted the AgentInfo of a removed Node", zap.String("agentinfo", ai.Name))
	}
}

// annotateRealization sets, on every NetworkPolicy, how many Nodes of its
// span report its current generation as realized.
func (l *Leader) annotateRealization(ctx context.Context, listNPs lister[*networkingv1.NetworkPolicy],
	getComputed func(string) (*cpv1alpha1.NetworkPolicy, error), listAgents lister[*opsv1alpha1.AgentInfo]) {
	nps, err := listNPs(labels.Everything())
	if err != nil {
		return
	}
	ais, _ := listAgents(labels.Everything())
	realized := map[string]map[string]int64{} // NodeKey → computed name → generation
	for _, ai := range ais {
		realized[cpv1alpha1.NodeKey(ai.Name)] = ai.Status.RealizedPolicies
	}
	for _, np := range nps {
		name := "np-" + string(np.UID)
		c, err := getComputed(name)
		if err != nil {
			continue // not computed yet
		}
		span, done := 0, 0
		for k := range c.Labels {
			key, ok := strings.CutPrefix(k, cpv1alpha1.SpanLabelPrefix)
			if !ok {
				continue
			}
			span++
			if g, ok := realized[key][name]; ok && g == np.Generation {
				done++
			}
		}
		want := map[string]string{
			AnnotationRealizedNodes:      fmt.Sprintf("%d/%d", done, span),
			AnnotationRealizedGeneration: strconv.FormatInt(np.Generation, 10),
		}
		if np.Annotations[AnnotationRealizedNodes] == want[AnnotationRealizedNodes] &&
			np.Annotations[AnnotationRealizedGeneration] == want[AnnotationRealizedGeneration] {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
		_, err = l.kube.NetworkingV1().NetworkPolicies(np.Namespace).Patch(ctx, np.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			l.log.Warn("annotating NetworkPolicy realization", zap.String("networkpolicy", np.Namespace+"/"+np.Name), zap.Error(err))
		}
	}
}

// Package info keeps the ops.seine.io objects that describe Seine's
// runtime state up to date:
//
//   - every daemon writes its Node's AgentInfo (RunAgent);
//   - the policy controller's leader writes the ControllerInfo, deletes
//     the AgentInfos of Nodes that no longer exist, and annotates every
//     networking.k8s.io NetworkPolicy with how many Nodes realized its
//     current generation (the leader tasks of Leader).
package info

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
)

// Defaults of AgentConfig.
const (
	DefaultHeartbeat = 60 * time.Second
	DefaultCheck     = 5 * time.Second
)

// AgentConfig configures RunAgent.
type AgentConfig struct {
	// NodeName and NodeUID name the Node; the AgentInfo has the Node's
	// name and the Node as owner, so the garbage collector deletes it
	// with the Node.
	NodeName string
	NodeUID  types.UID
	// Status computes the figures (everything but APIConnected).
	Status func(ctx context.Context) (opsv1alpha1.AgentInfoStatus, error)
	// Heartbeat is the longest time between two writes (default 60 s);
	// Check how often the figures are compared with the last written
	// ones, a change being written at once (default 5 s).
	Heartbeat, Check time.Duration
}

// RunAgent writes the Node's AgentInfo until ctx ends: at once, whenever a
// figure or condition changes (checked every Check), and at least every
// Heartbeat. Failed writes are retried at the next check; the first write
// after a failure gives APIConnected the reason Reconnected and the last
// error.
func RunAgent(ctx context.Context, client opsclient.Interface, cfg AgentConfig, log *zap.Logger) error {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Check <= 0 {
		cfg.Check = DefaultCheck
	}
	w := &agentWriter{client: client.OpsV1alpha1().AgentInfos(), cfg: cfg, log: log}
	t := time.NewTicker(cfg.Check)
	defer t.Stop()
	for {
		w.tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type agentClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*opsv1alpha1.AgentInfo, error)
	Create(ctx context.Context, o *opsv1alpha1.AgentInfo, opts metav1.CreateOptions) (*opsv1alpha1.AgentInfo, error)
	Update(ctx context.Context, o *opsv1alpha1.AgentInfo, opts metav1.UpdateOptions) (*opsv1alpha1.AgentInfo, error)
}

type agentWriter struct {
	client agentClient
	cfg    AgentConfig
	log    *zap.Logger

	last      *opsv1alpha1.AgentInfo      // the object as last written (the server's copy)
	sent      opsv1alpha1.AgentInfoStatus // the status as last sent (full time precision)
	lastWrite time.Time
	apiErr    error // the last write's error
}

// stripVolatile strips what changes on every computation.
func stripVolatile(s opsv1alpha1.AgentInfoStatus) opsv1alpha1.AgentInfoStatus {
	s = *s.DeepCopy()
	s.LastHeartbeatTime = metav1.Time{}
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	return s
}

func (w *agentWriter) tick(ctx context.Context) {
	st, err := w.cfg.Status(ctx)
	if err != nil {
		w.log.Debug("computing AgentInfo", zap.Error(err))
		return
	}
	api := metav1.Condition{Type: opsv1alpha1.AgentAPIConnected, Status: metav1.ConditionTrue, Reason: "Connected"}
	if w.apiErr != nil {
		api.Reason, api.Message = "Reconnected", "the previous write failed: "+w.apiErr.Error()
	}
	var prev []metav1.Condition
	if w.last != nil {
		prev = w.sent.Conditions
	}
	conds := append([]metav1.Condition(nil), prev...)
	for _, c := range append(st.Conditions, api) {
		meta.SetStatusCondition(&conds, c)
	}
	st.Conditions = conds
	if w.last != nil && w.apiErr == nil && time.Since(w.lastWrite) < w.cfg.Heartbeat &&
		reflect.DeepEqual(stripVolatile(st), stripVolatile(w.sent)) {
		return
	}
	if err := w.write(ctx, st); err != nil {
		if w.apiErr == nil {
			w.log.Warn("writing AgentInfo failed; retrying", zap.Error(err))
		}
		w.apiErr = err
		return
	}
	w.sent, w.apiErr = st, nil
}

func (w *agentWriter) write(ctx context.Context, st opsv1alpha1.AgentInfoStatus) error {
	want := &opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: w.cfg.NodeName,
		Labels: map[string]string{"app.kubernetes.io/name": "seine"}}, Status: st}
	if w.cfg.NodeUID != "" {
		want.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: w.cfg.NodeName, UID: w.cfg.NodeUID}}
	}
	var got *opsv1alpha1.AgentInfo
	var err error
	if w.last != nil {
		want.ResourceVersion = w.last.ResourceVersion
		got, err = w.client.Update(ctx, want, metav1.UpdateOptions{})
	}
	if w.last == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		cur, gerr := w.client.Get(ctx, w.cfg.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			want.ResourceVersion = ""
			got, err = w.client.Create(ctx, want, metav1.CreateOptions{})
		case gerr != nil:
			return fmt.Errorf("reading AgentInfo %s: %w", w.cfg.NodeName, gerr)
		default:
			want.ResourceVersion = cur.ResourceVersion
			got, err = w.client.Update(ctx, want, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("writing AgentInfo %s: %w", w.cfg.NodeName, err)
	}
	w.last, w.lastWrite = got, time.Now()
	return nil
}

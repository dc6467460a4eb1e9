// Package controller runs Seine's NetworkPolicy controller: every `seine
// node` competes for a Lease (client-go leader election); the holder watches
// Pods, Namespaces, NetworkPolicies and Nodes, computes the
// controlplane.seine.io objects with package compute, and writes to the API
// server only the differences between what it computes and what is stored.
//
// Write order: a change that finds the controller idle is written at once;
// while it is busy, a created or updated object is written after a short
// coalescing delay (Config.WriteDelay, so a burst of Pod changes becomes one
// write per object); a group (AddressGroup, AppliedToGroup) or
// PodRealization that is no longer desired is deleted only after
// Config.DeleteDelay more, so a policy's new AddressGroups and
// AppliedToGroups exist before, and old ones vanish after, the policy object
// that references them is updated in the common case. A policy object no
// longer desired (its deletion revokes access) waits only until the
// policies and groups being or about to be written are stored, a
// replacement's included, and at most DeleteDelay. This is best effort,
// not a guarantee: agents must treat a referenced group that is not (yet)
// stored as empty. A Pod's CNI ADD does not depend on the order: it waits
// until the agent's own digest of what it has received matches the
// PodRealization digest, which covers every policy object and every
// AddressGroup slice count.
package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"

	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	"github.com/seine-net/seine/policy/compute"
)

// Defaults of Config.
const (
	DefaultLeaseNamespace = "seine-system"
	DefaultLeaseName      = "seine-controller"
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second
	DefaultWriteDelay     = 30 * time.Millisecond
	DefaultDeleteDelay    = 200 * time.Millisecond
	DefaultWorkers        = 8
)

// Config configures the controller. Zero fields take the defaults above.
type Config struct {
	// Identity names this instance in the Lease (the Node name). Required.
	Identity string
	// LeaseNamespace and LeaseName name the coordination.k8s.io Lease;
	// defaults seine-system / seine-controller.
	LeaseNamespace, LeaseName string
	// LeaseDuration, RenewDeadline and RetryPeriod are the leader election
	// timings (client-go leaderelection.LeaderElectionConfig); defaults
	// 15 s, 10 s, 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// SliceSize is the maximum number of members of an AddressGroup slice;
	// default compute.DefaultSliceSize (500).
	SliceSize int
	// Registry, when set, receives the controller's metrics.
	Registry *prometheus.Registry
	// WriteDelay coalesces changes of one object into one write while the
	// controller is busy (a change that finds it idle is written at once);
	// default 30 ms.
	WriteDelay time.Duration
	// DeleteDelay is how much longer than WriteDelay the deletion of a
	// group or PodRealization waits, and the longest a NetworkPolicy's
	// waits for other writes (see deleteDue); default 200 ms.
	DeleteDelay time.Duration
	// Workers is the number of concurrent writers; default 8.
	Workers int
	// Ops, when set, is read for AgentInfos: a Node's PodRealization is
	// split in slices only while its agent lists
	// v1alpha1.PodRealizationSlicesCapability (so agents of an earlier
	// release keep reading one object). Without it, never.
	Ops opsclient.Interface
	// PodRealizationSliceSize is the Pods per PodRealization slice a Node
	// must exceed before its PodRealization is split; default
	// compute.DefaultPodRealizationSliceSize (128).
	PodRealizationSliceSize int
	// QueueMetrics, when set, receives the metrics of each term's
	// workqueue (named "policy-controller"), and with them its stuck
	// items (health.QueueMetrics).
	QueueMetrics workqueue.MetricsProvider
}

func (c *Config) defaults() {
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = DefaultLeaseNamespace
	}
	if c.LeaseName == "" {
		c.LeaseName = DefaultLeaseName
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewDeadline <= 0 {
		c.RenewDeadline = DefaultRenewDeadline
	}
	if c.RetryPeriod <= 0 {
		c.RetryPeriod = DefaultRetryPeriod
	}
	if c.SliceSize <= 0 {
		c.SliceSize = compute.DefaultSliceSize
	}
	if c.WriteDelay <= 0 {
		c.WriteDelay = DefaultWriteDelay
	}
	if c.DeleteDelay <= 0 {
		c.DeleteDelay = DefaultDeleteDelay
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.PodRealizationSliceSize <= 0 {
		c.PodRealizationSliceSize = compute.DefaultPodRealizationSliceSize
	}
}

// Controller is one instance competing for leadership.
type Controller struct {
	kube    kubernetes.Interface
	cp      versioned.Interface
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	leader  atomic.Bool
	// elector is the current attempt's client-go elector: its GetLeader is
	// the Lease holder as this instance last read it.
	elector atomic.Pointer[leaderelection.LeaderElector]
	// mu guards current, the term this instance leads (nil otherwise).
	mu      sync.Mutex
	current *leading
	// term is the state of the current (or last) term, for Status.
	term atomic.Pointer[term]
	// leaderTasks run during every term (AddLeaderTask).
	leaderTasks []func(ctx context.Context)
}

// AddLeaderTask makes fn run, in its own goroutine, for every term this
// instance leads, with the term's context (cancelled when the term ends;
// the term ends only after fn returns). Call it before Run.
func (c *Controller) AddLeaderTask(fn func(ctx context.Context)) {
	c.leaderTasks = append(c.leaderTasks, fn)
}

// term is what Status reports of one leadership term.
type term struct {
	since       time.Time
	initialSync time.Duration
	last        *Round
}

// New returns a controller; it does nothing until Run.
func New(kube kubernetes.Interface, cp versioned.Interface, cfg Config, log *zap.Logger) (*Controller, error) {
	if cfg.Identity == "" {
		return nil, errors.New("policy controller: Config.Identity is required")
	}
	cfg.defaults()
	c := &Controller{kube: kube, cp: cp, cfg: cfg, log: log.With(zap.String("identity", cfg.Identity))}
	c.metrics = newMetrics(cfg.Registry, c)
	return c, nil
}

// Run competes for the Lease until ctx ends, and is then nil. While this
// instance leads it runs the controller; losing the Lease stops the
// controller, and Run competes again.
func Run(ctx context.Context, kube kubernetes.Interface, cp versioned.Interface, cfg Config, log *zap.Logger) error {
	c, err := New(kube, cp, cfg, log)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// IsLeader reports whether this instance holds the Lease now.
func (c *Controller) IsLeader() bool { return c.leader.Load() }

// ObservedLeader is the identity of the Lease holder as this instance last
// read it ("" before the first attempt): its own from the moment it
// acquires the Lease, another's as soon as an attempt to acquire or renew
// it finds it held by another instance. So a deposed leader sees its
// successor at its first renewal after it lost the Lease, while its term
// (IsLeader) lasts until client-go gives up renewing (renewDeadline).
func (c *Controller) ObservedLeader() string {
	if le := c.elector.Load(); le != nil {
		return le.GetLeader()
	}
	return ""
}

// Idle reports whether this instance leads, has reconciled everything it
// found at the start of its term, and has no pending work.
func (c *Controller) Idle() bool {
	c.mu.Lock()
	l := c.current
	c.mu.Unlock()
	return l != nil && l.idle()
}

// Run competes for the Lease until ctx ends (see the package Run).
func (c *Controller) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: c.cfg.LeaseNamespace, Name: c.cfg.LeaseName},
			Client:     c.kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
		}
		done := make(chan struct{})
		var started atomic.Bool
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   c.cfg.LeaseDuration,
			RenewDeadline:   c.cfg.RenewDeadline,
			RetryPeriod:     c.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            c.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					started.Store(true)
					defer close(done)
					if lctx.Err() != nil {
						return // the term ended before this goroutine ran
					}
					c.leader.Store(true)
					c.metrics.leader.Set(1)
					c.log.Info("became policy controller leader")
					defer func() {
						c.leader.Store(false)
						c.metrics.leader.Set(0)
						c.log.Info("stopped leading policy controller")
					}()
					if err := c.lead(lctx, termStart(lctx, lock, c.cfg.Identity)); err != nil && lctx.Err() == nil {
						c.log.Error("policy controller stopped", zap.Error(err))
					}
				},
				OnNewLeader: func(identity string) {
					if identity != c.cfg.Identity {
						c.log.Info("policy controller leader observed", zap.String("leader", identity))
					}
				},
				OnStoppedLeading: func() {
					// client-go calls it whenever the elector stops,
					// whether this instance led or not; the term's own
					// end is logged when lead returns, above.
					c.leader.Store(false)
					c.metrics.leader.Set(0)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("policy controller leader election: %w", err)
		}
		// le.Run starts OnStartedLeading in a goroutine and cancels its
		// context when it returns; wait for the controller to stop before
		// competing again, so two terms never overlap in this process.
		c.elector.Store(le)
		le.Run(ctx)
		if started.Load() {
			<-done
		}
		c.leader.Store(false)
		c.metrics.leader.Set(0)
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(c.cfg.RetryPeriod):
			}
		}
	}
	return nil
}

// termStart is when this instance's current term began: the Lease's
// acquireTime when the Lease names it (a restarted instance that takes
// back its own Lease continues the term; client-go keeps acquireTime
// then), else now.
func termStart(ctx context.Context, lock resourcelock.Interface, identity string) time.Time {
	rec, _, err := lock.Get(ctx)
	if err != nil || rec == nil || rec.HolderIdentity != identity || rec.AcquireTime.IsZero() {
		return time.Now()
	}
	return rec.AcquireTime.Time
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/seine-net/seine/datapath/flowsync"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/node/inspect"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/noderoute"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/node/proxy"
	"github.com/seine-net/seine/node/traceflow"
	"github.com/seine-net/seine/node/version"
	policyagent "github.com/seine-net/seine/policy/agent"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	policycontroller "github.com/seine-net/seine/policy/controller"
)

// Option adjusts Run.
type Option func(*options)

type options struct {
	level  zap.AtomicLevel
	recent io.WriterTo
}

// WithLogLevel gives Run the logger's level, which seinectl log-level
// changes.
func WithLogLevel(l zap.AtomicLevel) Option { return func(o *options) { o.level = l } }

// WithRecentLogs gives Run the daemon's recent log output, for support
// bundles.
func WithRecentLogs(w io.WriterTo) Option { return func(o *options) { o.recent = w } }

// operations is what operators see of the daemon: probes and metrics over
// HTTP, the local API, the AgentInfo, Traceflow and the leader's
// ControllerInfo and realization annotations. Run builds it in steps as
// the components it reads come up.
type operations struct {
	cfg     config.Config
	opts    options
	log     *zap.Logger
	reg     *prometheus.Registry
	probes  health.Probes
	ops     opsclient.Interface
	started time.Time
	// api is the local API (seinectl), served from the first start-up
	// step on; run gives it its backend once the datapath is up.
	api *localapi.Server

	pipelineGate, podsGate, cniGate *health.Gate
	// watchdog is the liveness check over the workers: the CNI server's
	// requests and the items of every workqueue (queues).
	watchdog *health.Watchdog
	queues   *health.QueueMetrics
}

// newOperations starts what needs nothing but the configuration: the
// probes (every readiness check failing until its step is done, and
// shutdown once ctx ends) and the metrics registry.
func newOperations(ctx context.Context, cfg config.Config, rc *rest.Config, reg *prometheus.Registry, log *zap.Logger, opts []Option) (*operations, error) {
	o := &operations{cfg: cfg, log: log, reg: reg, started: time.Now(),
		pipelineGate: health.NewGate("the pipeline of this run is not installed yet"),
		podsGate:     health.NewGate("the Pods attached before this start are not restored yet"),
		cniGate:      health.NewGate("the CNI server is not serving yet")}
	o.opts.level = zap.NewAtomicLevel()
	for _, fn := range opts {
		fn(&o.opts)
	}
	o.api = localapi.NewServer(nil, o.opts.level, o.probes.Handler(nil), log.Named("localapi"))
	orc := rest.CopyConfig(rc)
	orc.UserAgent = "seine-node"
	ops, err := opsclient.NewForConfig(orc)
	if err != nil {
		return nil, err
	}
	o.ops = ops
	// A CNI ADD may wait up to networkPolicy.realizeTimeout for the Pod's
	// policies: a longer timeout than the watchdog's would be taken for
	// a stuck worker.
	o.watchdog = health.NewWatchdog(max(health.DefaultStuckAfter, 2*cfg.NetworkPolicy.RealizeTimeout.Duration))
	o.queues = health.NewQueueMetrics(reg, o.watchdog)
	o.probes.Live.Add(health.CheckWorkers, o.watchdog.Check)
	o.probes.Ready.Add(health.CheckShutdown, func() error {
		if ctx.Err() != nil {
			return errors.New("the daemon is shutting down")
		}
		return nil
	})
	o.probes.Ready.Add(health.CheckOVSConnected, func() error { return fmt.Errorf("not connected to OVS yet") })
	o.probes.Ready.Add(health.CheckPipeline, o.pipelineGate.Check)
	o.probes.Ready.Add(health.CheckPodsRestored, o.podsGate.Check)
	o.probes.Ready.Add(health.CheckPoliciesRealized, func() error { return fmt.Errorf("the policy agent has not started yet") })
	o.probes.Ready.Add(health.CheckCNIServing, o.cniGate.Check)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "seine_build_info", Help: "Always 1; the version label names the build.",
			ConstLabels: prometheus.Labels{"version": version.Version()}}, func() float64 { return 1 }))
	return o, nil
}

// startProbes serves /metrics, /healthz and /readyz on metricsAddress
// until ctx ends, unless disabled. An empty host means the Node's IP:
// nodeIP, else $NODE_IP (the DaemonSet passes status.hostIP), else the
// address is not known yet and it reports false (call again once the Node
// is). Started (or disabled) reports true.
func (o *operations) startProbes(ctx context.Context, nodeIP net.IP, comps *components) (bool, error) {
	if nodeIP == nil {
		nodeIP = net.ParseIP(os.Getenv("NODE_IP"))
	}
	if o.cfg.MetricsAddress == "" {
		return true, nil
	}
	if host, _, err := net.SplitHostPort(o.cfg.MetricsAddress); err == nil && host == "" && nodeIP == nil {
		return false, nil
	}
	addr, err := health.ResolveAddress(o.cfg.MetricsAddress, nodeIP)
	if err != nil {
		return false, err
	}
	o.log.Info("serving metrics and probes", zap.String("address", addr))
	comps.Go(func() error { return health.Serve(ctx, addr, o.probes.Handler(o.reg), health.DefaultTimeouts()) })
	return true, nil
}

// datapath are the components the later steps read.
type datapath struct {
	bridge  pipeline.Bridge
	ovs     *ovsdb.Client
	ofc     *of.Client
	appctl  *ovsctl.Client
	flows   *flowsync.Syncer
	pods    *podnet.Backend
	policy  *policyagent.Agent
	proxy   *proxy.Proxier // nil when the proxy is off
	routes  *noderoute.Controller
	factory informers.SharedInformerFactory
	kube    kubernetes.Interface
	nodeUID types.UID
}

// datapathUp registers the datapath's checks and metrics.
func (o *operations) datapathUp(d *datapath) error {
	o.probes.Ready.Add(health.CheckOVSConnected, func() error { return inspect.OVSConnected(d.ovs, d.ofc) })
	// Work waiting for an ovs-vswitchd that is down is not stuck.
	o.watchdog.PauseWhile(func() bool { return inspect.OVSConnected(d.ovs, d.ofc) != nil })
	if d.policy != nil {
		o.probes.Ready.Add(health.CheckPoliciesRealized, d.policy.Realized)
		if err := d.policy.Register(o.reg); err != nil {
			return err
		}
	} else {
		o.probes.Ready.Add(health.CheckPoliciesRealized, func() error { return nil })
	}
	if err := d.flows.Register(o.reg); err != nil {
		return err
	}
	gauge := func(name, help string, fn func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn)
	}
	for _, c := range []prometheus.Collector{
		gauge("seine_flows", "OpenFlow entries Seine keeps installed on the integration bridge.", func() float64 { return float64(d.flows.Count()) }),
		gauge("seine_peer_nodes", "Peer Nodes programmed on this Node, whatever their route (see seine_peer_node_routes).", func() float64 { return float64(len(d.routes.Peers())) }),
		gauge("seine_local_pods", "Pods attached to this Node's bridge.", func() float64 { return float64(len(d.pods.Attachments())) }),
		gauge("seine_ovs_connected", "1 while the OVSDB and OpenFlow connections are up.", func() float64 {
			if d.ovs.Connected() && d.ofc.Connected() {
				return 1
			}
			return 0
		}),
		&tableFlows{flows: d.flows},
	} {
		if err := o.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// tableFlows exports seine_table_flows{table}: the flow entries Seine
// keeps in each table, named as the pipeline names them.
type tableFlows struct{ flows *flowsync.Syncer }

var tableFlowsDesc = prometheus.NewDesc("seine_table_flows", "OpenFlow entries Seine keeps installed, by pipeline table.", []string{"table"}, nil)

func (t *tableFlows) Describe(ch chan<- *prometheus.Desc) { ch <- tableFlowsDesc }

func (t *tableFlows) Collect(ch chan<- prometheus.Metric) {
	counts := t.flows.CountByTable()
	for _, ti := range pipeline.Tables() {
		ch <- prometheus.MustNewConstMetric(tableFlowsDesc, prometheus.GaugeValue, float64(counts[uint8(ti.Table)]), ti.Name)
	}
}

// inspector builds the inspector over the datapath.
func (o *operations) inspector(d *datapath) *inspect.Inspector {
	return inspect.New(inspect.Deps{
		Config: o.cfg, Bridge: d.bridge, StartTime: o.started, TrafficMode: string(o.cfg.TrafficEncapMode),
		OVSDB: d.ovs, OpenFlow: d.ofc, Appctl: d.appctl, Flows: d.flows, Pods: d.pods, Policy: d.policy,
		Peers:    func() int { return len(d.routes.Peers()) },
		NodeByIP: nodeByIP(d.factory),
		PodIP:    podIP(d.kube),
		Probes:   &o.probes, Registry: o.reg, Logs: o.opts.recent,
		Services: func(ctx context.Context) ([]proxy.Frontend, error) {
			if d.proxy == nil {
				return nil, nil
			}
			return d.proxy.Frontends(ctx)
		},
	})
}

// serveAPI serves the local API as a late component (it answers until
// the others have stopped): until run, only the log level and the probes,
// the other routes answering that the daemon is starting, doing what step
// returns.
func (o *operations) serveAPI(comps *components, step func() string) {
	o.api.SetStarting(step)
	comps.GoLate(func(ctx context.Context) error { return o.api.Serve(ctx, o.cfg.APISocket) })
}

// run, once the datapath is ready, gives the local API its backend and
// starts the AgentInfo writer and Traceflow, as components.
func (o *operations) run(ctx context.Context, d *datapath, comps *components) {
	in := o.inspector(d)
	o.api.SetBackend(in)
	comps.Go(func() error {
		return info.RunAgent(ctx, o.ops, info.AgentConfig{NodeName: o.cfg.NodeName, NodeUID: d.nodeUID,
			Status: in.AgentInfo}, o.log.Named("agentinfo"))
	})
	tf := traceflow.New(o.ops, traceflow.Config{NodeName: o.cfg.NodeName, NodeIP: d.bridge.NodeIP, Bridge: d.bridge,
		Pods: d.pods, Switch: d.ofc, Describe: in.DescribeOutput, NodeByIP: nodeByIP(d.factory), PodIP: podIP(d.kube),
		QueueMetrics: o.queues},
		o.log.Named("traceflow"))
	comps.Go(func() error { return tf.Run(ctx) })
}

// leaderTasks gives the policy controller the leader's ControllerInfo,
// AgentInfo clean-up and realization annotations.
func (o *operations) leaderTasks(pc *policycontroller.Controller, kube kubernetes.Interface, cp versioned.Interface) {
	l := info.NewLeader(kube, cp, o.ops, info.LeaderConfig{Identity: o.cfg.NodeName, Name: o.cfg.LeaderElection.Name,
		Status: pc.Status}, o.log.Named("leader-info"))
	for _, t := range l.Tasks() {
		pc.AddLeaderTask(t)
	}
}

func nodeByIP(f informers.SharedInformerFactory) func(net.IP) string {
	lister := f.Core().V1().Nodes().Lister()
	return func(ip net.IP) string {
		nodes, err := lister.List(labels.Everything())
		if err != nil {
			return ""
		}
		for _, n := range nodes {
			if nip := noderoute.InternalIP(n); nip != nil && nip.Equal(ip) {
				return n.Name
			}
		}
		return ""
	}
}

func podIP(kube kubernetes.Interface) func(ctx context.Context, namespace, name string) (string, error) {
	return func(ctx context.Context, namespace, name string) (string, error) {
		p, err := kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if p.Status.PodIP == "" || p.Spec.HostNetwork {
			return "", fmt.Errorf("pod %s/%s has no Pod IP (phase %s)", namespace, name, p.Status.Phase)
		}
		return p.Status.PodIP, nil
	}
}

// Package agent is the seine node daemon: it brings up this Node's bridge,
// gateway and tunnel, programs the pipeline, restores the Pods already
// attached, connects peer Nodes, masquerades Pod egress, and serves the CNI
// plugin. Run is the daemon's entry point (`seine ovs run` also calls
// EnsureNetdevReceiveBuffer).
//
// Start-up never clears the flow table: the flows of the previous run keep
// forwarding while the new run installs its own under a new cookie round,
// and only then are the old round's leftovers deleted.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/flowsync"
	"github.com/seine-net/seine/datapath/offload"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/ipam"
	"github.com/seine-net/seine/node/cni/install"
	cniserver "github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/node/health"
	"github.com/seine-net/seine/node/hostport"
	"github.com/seine-net/seine/node/nfconntrack"
	"github.com/seine-net/seine/node/noderoute"
	"github.com/seine-net/seine/node/podnet"
	"github.com/seine-net/seine/node/proxy"
	"github.com/seine-net/seine/node/snat"
	policyagent "github.com/seine-net/seine/policy/agent"
	"github.com/seine-net/seine/policy/client/clientset/versioned"
	policycontroller "github.com/seine-net/seine/policy/controller"
	"github.com/seine-net/seine/tunnel"
)

// Bridge external_ids keys.
const (
	extIDRound = "seine.io/round"
)

// OpenFlow port numbers requested for the tunnel, gateway and segmentation
// ports, so that flows name the same ports on every Node and across
// restarts that make a port anew (the segmentation pair follows the MTU,
// which changes with the traffic mode). The segmentation port's number
// sits far above those OVS gives Pods, so an upgraded Node's Pods cannot
// hold it. (Before the segmentation pair's other end hairpinned in the
// kernel, it was an OVS port too, ofport 65002; addSegmentPort and
// removeSegmentPort remove it.)
const (
	TunnelOFPort      int32 = 1
	GatewayOFPort     int32 = 2
	SegmentPortOFPort int32 = 65001
)

// Run runs the daemon until ctx ends. It also stops, with an error, when
// a restarted ovs-vswitchd refuses a Pod's egress meter: the flows through
// it cannot be replayed, and a new start gives that Pod its qdisc alone
// (the DaemonSet or the systemd unit starts seine again).
//
// Start-up runs the steps below in order, each logged with its duration
// ("start-up step done") and exported as
// seine_startup_step_duration_seconds{step}; a step's error ends Run,
// named after the step.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger, opts ...Option) (err error) {
	ctx, fail := context.WithCancelCause(ctx)
	d := &daemon{cfg: cfg, log: log.With(zap.String("node", cfg.NodeName)), reg: prometheus.NewRegistry(),
		opts: opts, comps: newComponents(), fail: fail}
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, errMeterReplay) {
			err = cause
		}
		// Stop the components, let them finish on live connections,
		// then close those.
		fail(nil)
		if !d.comps.stop(shutdownGrace) {
			d.log.Warn("components still running after the shutdown grace period; closing their connections",
				zap.Duration("grace", shutdownGrace))
		}
		d.close()
	}()
	stepSeconds := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "seine_startup_step_duration_seconds",
		Help: "How long each start-up step of this run of the daemon took (node, ovsdb, transport, bridge, pipeline, proxy, pods, peers, policy, round, serve); a step not finished yet has no series.",
	}, []string{"step"})
	d.reg.MustRegister(stepSeconds)
	for _, step := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"node", d.findNode},
		{"ovsdb", d.connectOVSDB},
		{"transport", d.setupTransport},
		{"bridge", d.setupBridge},
		{"pipeline", d.installPipeline},
		{"proxy", d.startProxy},
		{"pods", d.restorePods},
		{"peers", d.startPeers},
		{"policy", d.startPolicy},
		{"round", d.finishRound},
		{"serve", d.serve},
	} {
		began := time.Now()
		d.step.Store(step.name)
		if err := step.run(ctx); err != nil {
			return fmt.Errorf("start-up step %s: %w", step.name, err)
		}
		elapsed := time.Since(began)
		stepSeconds.WithLabelValues(step.name).Set(elapsed.Seconds())
		d.log.Info("start-up step done", zap.String("step", step.name), zap.Duration("elapsed", elapsed))
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.comps.reports:
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		}
	}
}

// daemon is one run of the node daemon: what Run's start-up steps build.
// A field is set by one step and read by the steps after it. The
// OpenFlow connection's reconnect hook (replay) may run before a later
// step: it reads the fields set before the connection was made
// (installPipeline), and what later steps build only through the atomic
// replay* fields.
type daemon struct {
	cfg   config.Config
	log   *zap.Logger
	reg   *prometheus.Registry
	opts  []Option
	comps *components // the long-lived goroutines, see components
	fail  context.CancelCauseFunc
	step  atomic.Value // string: the start-up step running, for the local API
	// closers run in reverse order when Run returns.
	closers []func()

	// node
	ops                  *operations
	rc                   *rest.Config
	kube                 kubernetes.Interface
	cp                   versioned.Interface
	node                 *corev1.Node
	nodeIP               net.IP
	ownsPods             bool       // false in networkPolicyOnly mode: a primary CNI owns the Pods
	podCIDR, clusterCIDR *net.IPNet // podCIDR nil when !ownsPods

	// ovsdb, transport, bridge
	ovs          *ovsdb.Client
	tunnelKind   tunnel.Kind
	transport    tunnel.Transport
	mtu          mtus
	round        uint16 // this run's cookie round; round-1 is the previous run's (0: none)
	tunPort      uint32
	kernelTunnel *tunnel.KernelVXLAN
	gwPort       ovsdb.Port
	gwIP         net.IP
	gwMAC        net.HardwareAddr
	tso          bool // ovs-vswitchd runs with userspace TSO

	// pipeline
	ofc    *of.Client
	flows  *flowsync.Syncer
	bridge pipeline.Bridge

	// What replay reads, stored as each is built: the OpenFlow connection
	// can come back before.
	replayFlows atomic.Pointer[flowsync.Syncer]
	replayProxy atomic.Pointer[proxy.Proxier]
	replayPods  atomic.Pointer[podnet.Backend]
	replaySeed  atomic.Pointer[seedKeeper]

	// proxy, pods, peers, policy
	svcProxy    *proxy.Proxier // nil when the proxy is disabled
	policyAgent *policyagent.Agent
	alloc       *ipam.Allocator
	pods        *podnet.Backend
	factory     informers.SharedInformerFactory
	routes      *noderoute.Controller
}

func (d *daemon) onClose(fn func()) { d.closers = append(d.closers, fn) }

func (d *daemon) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// findNode builds the API clients and the operators' view (probes first:
// /healthz answers while the daemon waits for the API server, OVS or its
// podCIDR, when the address to serve on is known before the Node is; see
// startProbes), then waits for this Node and its podCIDR.
func (d *daemon) findNode(ctx context.Context) error {
	cfg := d.cfg
	var err error
	if d.rc, err = restConfig(cfg.Kubeconfig, cfg.KubeAPIServerOverride); err != nil {
		return err
	}
	if d.ops, err = newOperations(ctx, cfg, d.rc, d.reg, d.log, d.opts); err != nil {
		return err
	}
	probesUp, err := d.ops.startProbes(ctx, nil, d.comps)
	if err != nil {
		return err
	}
	// seinectl reaches a daemon that is still starting (log-level, and
	// what it is waiting for).
	d.ops.serveAPI(d.comps, func() string { return "start-up step " + d.step.Load().(string) })
	if d.kube, d.cp, err = kubeClients(d.rc); err != nil {
		return err
	}
	d.ownsPods = cfg.TrafficEncapMode.OwnsPodNetwork()
	if d.node, err = waitForNode(ctx, d.kube, cfg.NodeName, d.ownsPods, d.log); err != nil {
		return err
	}
	checkIdentity(ctx, d.kube, cfg.NodeName, d.log)
	if d.nodeIP = noderoute.InternalIP(d.node); d.nodeIP == nil {
		return fmt.Errorf("node %s has no IPv4 InternalIP", cfg.NodeName)
	}
	if d.ownsPods {
		_, d.podCIDR, err = net.ParseCIDR(d.node.Spec.PodCIDR)
		if err != nil || d.podCIDR.IP.To4() == nil {
			return fmt.Errorf("node %s: podCIDR %q is not an IPv4 CIDR", cfg.NodeName, d.node.Spec.PodCIDR)
		}
	}
	_, d.clusterCIDR, _ = net.ParseCIDR(cfg.ClusterCIDR) // valid: config.Validate
	if err := checkPodCIDR(cfg.NodeName, d.podCIDR, d.clusterCIDR); err != nil {
		return err
	}
	d.log.Info("node found", zap.String("node_ip", d.nodeIP.String()), zap.Stringer("pod_cidr", d.podCIDR),
		zap.String("traffic_encap_mode", string(cfg.TrafficEncapMode)), zap.Bool("snat", cfg.SNATEnabled()))
	if !probesUp {
		if _, err := d.ops.startProbes(ctx, d.nodeIP, d.comps); err != nil {
			return err
		}
	}
	return nil
}

// checkPodCIDR fails when node's podCIDR (nil: the Node owns no Pod
// addresses) is not inside clusterCIDR. The masquerade rules know the
// cluster's Pods by clusterCIDR alone, so Pods outside it would leave the
// cluster with addresses nothing routes back.
func checkPodCIDR(node string, podCIDR, clusterCIDR *net.IPNet) error {
	if podCIDR == nil {
		return nil
	}
	podOnes, _ := podCIDR.Mask.Size()
	clusterOnes, _ := clusterCIDR.Mask.Size()
	if podOnes >= clusterOnes && clusterCIDR.Contains(podCIDR.IP) {
		return nil
	}
	return fmt.Errorf("clusterCIDR %s does not hold node %s's podCIDR %s: set clusterCIDR to the cluster's Pod range "+
		"(kube-controller-manager --cluster-cidr; the manifest's --cluster-cidr)", clusterCIDR, node, podCIDR)
}

// connectOVSDB connects to the local OVSDB server, waiting for it, and
// settles the tunnel type (the cluster's, when the configuration leaves
// it to the daemon).
func (d *daemon) connectOVSDB(ctx context.Context) error {
	var err error
	if d.ovs, err = dialOVSDB(ctx, d.cfg.OVSDBEndpoint(), d.log); err != nil {
		return err
	}
	d.onClose(d.ovs.Close)
	if d.cfg.TunnelType, err = chooseTunnelType(ctx, d.cfg, d.ovs, d.ops.ops, d.log); err != nil {
		return err
	}
	d.ops.cfg.TunnelType = d.cfg.TunnelType
	return nil
}

// setupTransport finds the interface that carries the Node IP (on the
// userspace datapath, with userspace TSO asked for and the ports' receive
// buffer raised) and derives the Pods' MTUs from it.
func (d *daemon) setupTransport(ctx context.Context) error {
	cfg := d.cfg
	if userspaceDatapath(cfg) {
		if err := setUserspaceTSO(ctx, cfg, d.ovs, d.log); err != nil {
			return err
		}
		EnsureNetdevReceiveBuffer(cfg, d.log)
	}
	d.tunnelKind = tunnel.Choose(userspaceDatapath(cfg), cfg.TunnelType)
	var err error
	if d.transport, err = setupTransport(ctx, cfg, d.tunnelKind, d.ovs, d.nodeIP, d.log); err != nil {
		return err
	}
	if d.mtu, err = podMTUs(cfg, d.transport); err != nil {
		return err
	}
	d.log.Info("transport", zap.String("interface", d.transport.Name), zap.Int("transport_mtu", d.transport.MTU),
		zap.Int("pod_mtu", d.mtu.Pod), zap.Int("tunnel_mtu", d.mtu.Tunnel), zap.String("tunnel_type", cfg.TunnelType))
	return nil
}

// setupBridge makes the bridge, with a new cookie round, and its tunnel
// and gateway ports, configures the gateway and the host's sysctls, and
// reads whether ovs-vswitchd runs with userspace TSO.
func (d *daemon) setupBridge(ctx context.Context) error {
	cfg := d.cfg
	d.round = 1
	if ids, err := d.ovs.BridgeExternalIDs(ctx, cfg.BridgeName); err == nil {
		if r, err := strconv.ParseUint(ids[extIDRound], 10, 16); err == nil {
			d.round = uint16(r) + 1
			if d.round == 0 {
				d.round = 1
			}
		}
	}
	if err := d.ovs.EnsureBridge(ctx, ovsdb.BridgeConfig{
		Name:         cfg.BridgeName,
		DatapathType: cfg.OVSDatapathType,
		ExternalIDs:  map[string]string{extIDRound: strconv.Itoa(int(d.round))},
		TableNames:   pipeline.TableNames(),
	}); err != nil {
		return fmt.Errorf("bridge %s: %w", cfg.BridgeName, err)
	}
	var err error
	if d.tunPort, d.kernelTunnel, err = tunnelPort(ctx, cfg, d.tunnelKind, d.ovs, d.nodeIP, d.mtu.Tunnel); err != nil {
		return err
	}
	d.gwPort, err = d.ovs.EnsurePort(ctx, cfg.BridgeName, ovsdb.PortSpec{
		Name: cfg.GatewayName, Type: "internal", OFPortRequest: GatewayOFPort, MTURequest: d.mtu.Tunnel,
	})
	if err != nil {
		return fmt.Errorf("gateway port: %w", err)
	}
	if d.ownsPods {
		d.gwIP = noderoute.FirstIP(d.podCIDR)
	} else if err := clearGatewayAddresses(cfg.GatewayName); err != nil {
		return err
	}
	if d.gwMAC, err = setupGateway(cfg.GatewayName, d.gwIP, d.podCIDR, d.mtu.Tunnel); err != nil {
		return err
	}
	if err := setSysctls(cfg.GatewayName); err != nil {
		return err
	}
	// Userspace TSO is in effect only if ovs-vswitchd started with it.
	if userspaceDatapath(cfg) {
		if d.tso, err = offload.UserspaceTSOActive(cfg.GatewayName); err != nil {
			return err
		}
		if cfg.UserspaceTSOEnabled() && !d.tso {
			d.log.Warn("ovs-vswitchd runs without userspace TSO: Pods get checksum offload off and traffic crosses the bridge one MTU-sized packet at a time until ovs-vswitchd restarts")
		}
	}
	return nil
}

// installPipeline connects to the bridge over OpenFlow, settles how
// tunnel-bound and NATed packets leave (segmentation port, checksum seed
// program) and installs the pipeline's base flows under this run's round.
func (d *daemon) installPipeline(ctx context.Context) error {
	cfg := d.cfg
	var err error
	d.ofc, err = of.Dial(ctx, cfg.BridgeMgmtSocket(), d.log.Named("openflow"), of.WithOnReconnect(d.replay))
	if err != nil {
		return fmt.Errorf("OpenFlow connection to %s: %w", cfg.BridgeMgmtSocket(), err)
	}
	d.onClose(func() { _ = d.ofc.Close() })
	d.flows = flowsync.New(d.ofc)
	d.replayFlows.Store(d.flows)
	d.bridge = pipeline.Bridge{
		Round:       d.round,
		GatewayPort: uint32(d.gwPort.OFPort),
		GatewayMAC:  d.gwMAC,
		GatewayIP:   d.gwIP,
		PodCIDR:     d.podCIDR,
		NodeIP:      d.nodeIP,
		TunnelPort:  d.tunPort,
		PolicyOnly:  !d.ownsPods,
	}
	// The segmentation port, where the tunnel needs it, before the checksum
	// seed program, which hooks it too; where only the NAT checksum detour
	// needs it, after the program, once the kernel has refused it. A port
	// an earlier run left and this one does not need goes once its flows
	// have (finishRound).
	tunnelEgress(cfg, d.tunnelKind, d.tso, &d.bridge)
	if tunnelSegments(d.bridge) {
		if err := addSegmentPort(ctx, cfg, d.ovs, d.mtu.Tunnel, &d.bridge); err != nil {
			return err
		}
	}
	seed := partialChecksums(cfg, d.tunnelKind, d.tso, &d.bridge, d.log)
	if segmentPortNeeded(cfg, d.tso, d.bridge) && d.bridge.SegmentPort == 0 {
		if err := addSegmentPort(ctx, cfg, d.ovs, d.mtu.Tunnel, &d.bridge); err != nil {
			return err
		}
	}
	if seed != nil {
		keeper := newSeedKeeper(seed, seedHooks(cfg, d.tunnelKind, d.bridge), d.reg, d.log)
		d.onClose(func() { _ = keeper.close() })
		d.replaySeed.Store(keeper)
		go keeper.run(ctx, 30*time.Second)
	}
	registerNATChecksumMetric(d.reg, d.bridge)
	if cfg.TrafficEncapMode.UsesTunnel() {
		d.log.Info("tunnel", zap.String("kind", d.tunnelKind.String()), zap.Stringer("egress", d.bridge.Tunnel),
			zap.Bool("userspace_tso", d.tso))
	}
	baseFlows := append(pipeline.BaseFlows(d.bridge), pipeline.TraceFlows(d.bridge)...)
	if cfg.PolicyEnabled() {
		baseFlows = append(baseFlows, pipeline.PolicyBaseFlows(d.bridge)...)
	}
	return d.flows.Set(ctx, "pipeline", baseFlows)
}

// replay puts back, in dependency order, what a restarted ovs-vswitchd
// lost: the transport's attachment, the checksum seed filters, the
// Services' groups, the Pods' meters, every flow, and the Pods' shaping.
// It is the OpenFlow connection's reconnect hook.
func (d *daemon) replay(ctx context.Context) error {
	cfg := d.cfg
	d.log.Warn("OpenFlow connection re-established; replaying all groups and flows")
	if netdevTransportBridge(cfg, d.tunnelKind) {
		if _, err := attachNetdevTransport(ctx, cfg, d.ovs, d.nodeIP, d.log); err != nil {
			return fmt.Errorf("attaching the transport again: %w", err)
		}
	}
	// Before the flows, which send NATed packets out directly. The
	// filters outlive ovs-vswitchd (its taps persist); this is for a
	// device it made anew. A failure must not hold up the flows: the
	// keeper logs it, exports it and tries again.
	if k := d.replaySeed.Load(); k != nil {
		k.ensure()
	}
	if p := d.replayProxy.Load(); p != nil {
		if err := p.ReplayGroups(ctx); err != nil {
			return fmt.Errorf("replaying service groups: %w", err)
		}
	}
	// Before the flows that use them.
	pods := d.replayPods.Load()
	if pods != nil {
		if err := pods.ReplayMeters(ctx); err != nil {
			err = fmt.Errorf("%w: %w", errMeterReplay, err)
			d.log.Error("stopping", zap.Error(err))
			d.fail(err)
			return err
		}
	}
	if f := d.replayFlows.Load(); f != nil {
		if err := f.Replay(ctx); err != nil {
			return err
		}
	}
	// Shaping comes after forwarding, and never holds it up.
	if pods != nil {
		if err := pods.ReshapePods(ctx); err != nil {
			d.log.Error("shaping Pod traffic again after ovs-vswitchd restarted", zap.Error(err))
		}
	}
	return nil
}

// startProxy starts the Service proxy, or removes what an earlier run's
// left. It comes first among the controllers: it needs only the bridge
// and the pipeline, and its informers' initial lists and its programming
// overlap the rest of the start-up.
func (d *daemon) startProxy(ctx context.Context) error {
	cfg := d.cfg
	if !cfg.ProxyEnabled() {
		if err := proxy.Cleanup(ctx, cfg.GatewayName, d.ofc); err != nil {
			d.log.Warn("removing the leftovers of the Service proxy failed", zap.Error(err))
		}
		return nil
	}
	npAddrs := cfg.NodePortCIDRs()
	if len(npAddrs) == 0 {
		npAddrs = []*net.IPNet{{IP: d.nodeIP.To4(), Mask: net.CIDRMask(32, 32)}}
	}
	_, svcCIDR, _ := net.ParseCIDR(cfg.ServiceCIDR)
	pcfg := proxy.Config{NodeName: cfg.NodeName, Bridge: d.bridge,
		SkipServices: cfg.Proxy.SkipServices, ProxyAll: cfg.ProxyAllEnabled(), Gateway: cfg.GatewayName,
		ServiceCIDR: svcCIDR, NodePortAddresses: npAddrs, LocalVIPAliases: cfg.LocalVIPAliases(),
		Registry: d.reg, QueueMetrics: d.ops.queues,
		Conntrack: ovsctl.New(cfg.OVSRunDir), ReflushDelay: proxy.DefaultReflushDelay,
		MinPurgeInterval: proxy.DefaultMinPurgeInterval, HealthAddress: cfg.Proxy.HealthzBindAddress}
	if d.gwIP == nil {
		pcfg.RouteSource = d.nodeIP // the gateway has no address of its own
	}
	p, err := proxy.New(d.kube, d.flows, d.ofc, pcfg, d.log.Named("proxy"))
	if err != nil {
		return err
	}
	d.svcProxy = p
	d.replayProxy.Store(p)
	d.comps.Go(func() error { return p.Run(ctx) })
	if cfg.ProxyAllEnabled() {
		d.comps.Go(func() error { tuneConntrack(ctx, cfg.Proxy.Conntrack, d.log); return nil })
	}
	return nil
}

// tuneConntrack applies proxy.conntrack (standing in for kube-proxy, which
// would) and logs what it changed. A setting it cannot write is logged and
// left: the data plane works with the host's values. The nf_conntrack
// module may load only once the first of seine's nftables rules that
// track connections is in (the proxy's host rules, SNAT), so a missing
// module is waited for, up to a minute.
func tuneConntrack(ctx context.Context, c config.ConntrackConfig, log *zap.Logger) {
	want := nfconntrack.Config{MaxPerCore: int(c.MaxPerCore), Min: int(c.Min),
		TCPEstablishedTimeout: c.TCPEstablishedTimeout.Duration, TCPCloseWaitTimeout: c.TCPCloseWaitTimeout.Duration,
		TCPBeLiberal: c.TCPBeLiberal, UDPTimeout: c.UDPTimeout.Duration, UDPStreamTimeout: c.UDPStreamTimeout.Duration}
	var changes []nfconntrack.Change
	var err error
	for try := 1; ; try++ {
		if changes, err = nfconntrack.Apply(want, nfconntrack.Paths{}); !errors.Is(err, nfconntrack.ErrNotLoaded) {
			break
		}
		if try == 30 {
			log.Warn("the nf_conntrack module did not load within a minute; proxy.conntrack is not applied until the daemon restarts", zap.Error(err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
	for _, ch := range changes {
		log.Info("conntrack setting changed", zap.String("setting", ch.Name), zap.Int("before", ch.Before), zap.Int("after", ch.After))
	}
	if err != nil {
		log.Warn("some conntrack settings of proxy.conntrack could not be applied; the host's stay", zap.Error(err))
	}
}

// restorePods builds the CNI backend (with this Node's NetworkPolicy
// agent, which it tells of Pods coming and going, and IPAM, hostPorts and
// meters) and restores the Pods attached before this start.
func (d *daemon) restorePods(ctx context.Context) error {
	cfg := d.cfg
	if cfg.PolicyEnabled() {
		// It runs only from startPolicy on, once d.pods is set.
		d.policyAgent = policyagent.New(d.cp, policyagent.Config{
			NodeName:       cfg.NodeName,
			Bridge:         d.bridge,
			Flows:          d.flows,
			RealizeTimeout: cfg.NetworkPolicy.RealizeTimeout.Duration,
			OnIsolation: func(ctx context.Context, namespace, name string, ingress, egress bool) error {
				return d.pods.SetIsolation(ctx, namespace, name, ingress, egress)
			},
			AfterChange:  ovsctl.New(cfg.OVSRunDir).PurgeDatapathFlows,
			QueueMetrics: d.ops.queues,
		}, d.log.Named("policy-agent"))
	}
	if d.ownsPods {
		var reset bool
		var err error
		d.alloc, reset, err = ipam.Open(filepath.Join(cfg.DataDir, "ipam"), d.podCIDR)
		if err != nil {
			return err
		}
		if reset {
			d.log.Warn("podCIDR changed since the last run: previous IP allocations discarded")
		}
	}
	hostPorts, err := startHostPorts(ctx, d.ownsPods, hostport.Config{Gateway: cfg.GatewayName})
	if err != nil {
		return err
	}
	d.pods = podnet.New(podnet.Config{
		BridgeName:        cfg.BridgeName,
		Bridge:            d.bridge,
		MTU:               d.mtu.Pod,
		RouteMTU:          d.mtu.Tunnel,
		DisableTxChecksum: userspaceDatapath(cfg) && !d.tso,
		Policy:            policyHook(d.policyAgent),
		Chained:           !d.ownsPods,
		Gateway:           cfg.GatewayName,
		NodeIP:            d.nodeIP,
		Metrics:           d.reg,
		HostPorts:         hostPorts,
		Meters:            podMeters(ctx, d.ownsPods, d.podCIDR, d.ofc, d.log),
	}, d.alloc, d.ovs, d.flows, d.log.Named("podnet"))
	// Before the restore, which installs flows through meters: a
	// reconnect meanwhile must put those meters back.
	d.replayPods.Store(d.pods)
	restored, err := d.pods.RestorePods(ctx)
	if err != nil {
		return fmt.Errorf("restoring Pods: %w", err)
	}
	d.log.Info("restored attached Pods", zap.Int("pods", restored))
	d.ops.podsGate.Open()
	return nil
}

// startPeers masquerades Pod egress and starts the route controller,
// which connects every peer Node (tunnel, routes, flows).
func (d *daemon) startPeers(ctx context.Context) error {
	cfg := d.cfg
	nft, err := snat.NewNFTables()
	if err != nil {
		return err
	}
	masq := snat.New(nft, d.clusterCIDR, cfg.GatewayName, cfg.SNATEnabled())
	rcfg := noderoute.Config{NodeName: cfg.NodeName, Mode: cfg.TrafficEncapMode, Transport: d.transport.Name,
		Gateway: cfg.GatewayName, Bridge: d.bridge, Flows: d.flows, Tunnel: peerTunnel(d.kernelTunnel),
		QueueMetrics: d.ops.queues}
	if d.ownsPods {
		masq.SetNodeIP(cfg.NodeName, d.nodeIP)
		if err := masq.Sync(ctx); err != nil {
			return err
		}
		rcfg.SNAT = masq
	} else if err := masq.Cleanup(ctx); err != nil {
		return err
	}
	if netdevTransportBridge(cfg, d.tunnelKind) {
		rcfg.Neighbors = &tunnel.Neighbors{Bridge: cfg.TransportBridge, Appctl: ovsctl.New(cfg.OVSRunDir)}
	}
	d.factory = informers.NewSharedInformerFactory(d.kube, 0)
	if d.routes, err = noderoute.New(d.factory.Core().V1().Nodes(), rcfg, d.log.Named("noderoute")); err != nil {
		return err
	}
	d.factory.Start(ctx.Done())
	d.comps.Go(func() error { return d.routes.Run(ctx) })
	return nil
}

// startPolicy runs this Node's NetworkPolicy agent (enforcement) and its
// instance of the leader-elected controller.
func (d *daemon) startPolicy(ctx context.Context) error {
	if d.policyAgent == nil {
		return nil
	}
	cfg := d.cfg
	d.comps.Go(func() error { return d.policyAgent.Run(ctx) })
	// The leader writes every computed object of the cluster: its own
	// client and rate limit, so a cold start of a large cluster is not
	// throttled to the agent's 50 requests per second.
	crc := rest.CopyConfig(d.rc)
	crc.UserAgent = "seine-policy-controller"
	crc.QPS, crc.Burst = cfg.NetworkPolicy.ControllerQPS, cfg.NetworkPolicy.ControllerBurst
	ccp, err := versioned.NewForConfig(crc)
	if err != nil {
		return err
	}
	pc, err := policycontroller.New(d.kube, ccp, policycontroller.Config{
		Identity:       cfg.NodeName,
		LeaseNamespace: cfg.LeaderElection.Namespace,
		LeaseName:      cfg.LeaderElection.Name,
		LeaseDuration:  cfg.LeaderElection.LeaseDuration.Duration,
		RenewDeadline:  cfg.LeaderElection.RenewDeadline.Duration,
		RetryPeriod:    cfg.LeaderElection.RetryPeriod.Duration,
		SliceSize:      cfg.NetworkPolicy.AddressGroupSliceSize,
		Workers:        cfg.NetworkPolicy.ControllerWorkers,
		Registry:       d.reg,
		Ops:            d.ops.ops,
		QueueMetrics:   d.ops.queues,
	}, d.log.Named("policy-controller"))
	if err != nil {
		return err
	}
	d.ops.leaderTasks(pc, d.kube, d.cp)
	d.comps.Go(func() error { return pc.Run(ctx) })
	return nil
}

// finishRound waits until this run's flows stand for the cluster (every
// known peer connected, every Service programmed), then removes the
// previous run's round and what only its flows needed (the checksum seed
// filters, the segmentation port), and lets a restarted ovs-vswitchd
// forward with its new flows.
func (d *daemon) finishRound(ctx context.Context) error {
	cfg := d.cfg
	for typ, ok := range d.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	// Let the route controller install every known peer, the proxy every
	// Service and the policy agent every policy before the old round's
	// flows go away: the restored Pods are isolated already, and would
	// otherwise lose their allows until the agent's are in.
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(d.routes.Peers()) >= countPeers(d.factory, cfg.NodeName) && (d.svcProxy == nil || d.svcProxy.Synced()) &&
			(d.policyAgent == nil || d.policyAgent.Synced()), nil
	})
	if prevRound := d.round - 1; prevRound != 0 {
		if err := d.ofc.DeleteMatching(ctx, uint64(prevRound)<<pipeline.CookieRoundShift, pipeline.CookieRoundMask); err != nil {
			return fmt.Errorf("removing flows of round %d: %w", prevRound, err)
		}
	}
	// Only now that no earlier round's flow sends NATed packets out
	// directly (the Services' flows save their headers again, if this
	// round takes the detour).
	if !d.bridge.PartialChecksumsRewritten {
		detachSeed(cfg, d.log)
	}
	// Likewise the segmentation port, which an earlier round's flows may
	// send packets through; left behind, it is only idle. Also on the
	// kernel datapath, which never adds it: a Node moved there from the
	// userspace one removes it (nothing to do, and no error, without it).
	if d.bridge.SegmentPort == 0 {
		if err := removeSegmentPort(ctx, cfg, d.ovs); err != nil {
			d.log.Warn("the segmentation port is not needed and could not be removed; ovs-vswitchd keeps reading it",
				zap.String("interface", tunnel.DefaultSegmentPair.Port), zap.Error(err))
		}
	}
	// An ovs-vswitchd restarted with the kernel datapath held its old
	// flows until now (see datapath/ovsdaemon).
	if err := d.ovs.ClearFlowRestoreWait(ctx); err != nil {
		return err
	}
	d.log.Info("datapath ready", zap.Uint16("round", d.round), zap.Int("flows", d.flows.Count()))
	d.ops.pipelineGate.Open()
	return nil
}

// serve registers the datapath's metrics and checks, keeps the primary
// CNI's conflist chained in networkPolicyOnly mode, serves the CNI plugin
// and starts the operators' API, AgentInfo and Traceflow.
func (d *daemon) serve(ctx context.Context) error {
	cfg := d.cfg
	alloc := d.alloc
	d.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "seine_pod_ips_allocated", Help: "Pod IPs allocated from this Node's podCIDR.",
	}, func() float64 {
		if alloc == nil {
			return 0
		}
		return float64(len(alloc.List()))
	}))
	registerModeMetrics(d.reg, cfg, d.routes)
	if !d.ownsPods {
		d.comps.Go(func() error {
			return install.KeepChained(ctx, cfg.PrimaryCNIConflist, cfg.CNISocket, d.log.Named("cni-chain"))
		})
		d.ops.probes.Ready.Add(health.CheckCNIChained, func() error { return chainedCheck(cfg.PrimaryCNIConflist) })
	}
	dp := &datapath{bridge: d.bridge, ovs: d.ovs, ofc: d.ofc, appctl: ovsctl.New(cfg.OVSRunDir), flows: d.flows,
		pods: d.pods, policy: d.policyAgent, proxy: d.svcProxy, routes: d.routes, factory: d.factory, kube: d.kube,
		nodeUID: d.node.UID}
	if err := d.ops.datapathUp(dp); err != nil {
		return err
	}
	d.pods.MarkReady()
	srv := cniserver.New(d.pods, d.log.Named("cni"), cniserver.WithRegistry(d.reg), cniserver.WithWatchdog(d.ops.watchdog))
	d.comps.Go(func() error { return srv.Serve(ctx, cfg.CNISocket) })
	d.ops.cniGate.Open()
	d.log.Info("serving CNI", zap.String("socket", cfg.CNISocket))
	d.ops.run(ctx, dp, d.comps)
	return nil
}

// policyHook adapts the policy agent to the CNI backend (nil when
// NetworkPolicy is disabled).
func policyHook(a *policyagent.Agent) podnet.PolicyHook {
	if a == nil {
		return nil
	}
	return agentHook{a}
}

type agentHook struct{ a *policyagent.Agent }

func (h agentHook) PodAttached(namespace, name string, ofport uint32, ip net.IP, restored bool) {
	h.a.PodAttached(policyagent.LocalPod{Namespace: namespace, Name: name, OFPort: ofport, IP: ip, Restored: restored})
}

func (h agentHook) PodDetached(namespace, name string) { h.a.PodDetached(namespace, name) }

func (h agentHook) WaitRealized(ctx context.Context, namespace, name, uid string) error {
	return h.a.WaitRealized(ctx, namespace, name, uid)
}

func countPeers(f informers.SharedInformerFactory, self string) int {
	nodes, err := f.Core().V1().Nodes().Lister().List(labels.Everything())
	if err != nil {
		return 0
	}
	n := 0
	for _, node := range nodes {
		if node.Name != self && node.Spec.PodCIDR != "" && noderoute.InternalIP(node) != nil {
			n++
		}
	}
	return n
}

// dialOVSDB connects to the local OVSDB server, waiting for it: in a
// DaemonSet, Open vSwitch runs in the seine-ovs Pod, which may start
// after this one or be replaced under it.
func dialOVSDB(ctx context.Context, endpoint string, log *zap.Logger) (*ovsdb.Client, error) {
	var ovs *ovsdb.Client
	last := time.Time{}
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := ovsdb.Dial(dctx, endpoint, log.Named("ovsdb"))
		if err == nil {
			if err = c.WaitInitialized(dctx); err != nil {
				c.Close()
			}
		}
		if err != nil {
			if time.Since(last) > 10*time.Second {
				last = time.Now()
				log.Info("waiting for OVSDB", zap.String("endpoint", endpoint), zap.NamedError("last_error", err))
			}
			return false, nil
		}
		ovs = c
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to OVSDB at %s: %w", endpoint, err)
	}
	return ovs, nil
}

// serviceAccountDir holds the in-cluster credentials a Pod gets
// (kubernetes.io/docs: "Accessing the Kubernetes API from a Pod").
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// restConfig loads the API server connection: from the kubeconfig file when
// one is given, else in-cluster. apiServer, when set, replaces the server
// (kubeAPIServerOverride): in-cluster it keeps the ServiceAccount's token
// and CA but skips the "kubernetes" Service address, which nothing serves
// in a cluster without kube-proxy until seine's proxy runs.
func restConfig(kubeconfig, apiServer string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags(apiServer, kubeconfig)
	case apiServer != "":
		token := filepath.Join(serviceAccountDir, "token")
		if _, err = os.Stat(token); err == nil {
			rc = &rest.Config{Host: apiServer, BearerTokenFile: token,
				TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(serviceAccountDir, "ca.crt")}}
		} else {
			err = fmt.Errorf("kubeAPIServerOverride without a kubeconfig needs the ServiceAccount token: %w", err)
		}
	default:
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	return rc, nil
}

// kubeClients returns the clients of the daemon's own API calls (watches
// of its Node's share, CNI lookups, status): 50 requests per second, bursts
// of 100. Built-in kinds travel as protobuf, as kube-proxy's do: lists of
// tens of thousands of Services and EndpointSlices decode several times
// faster than JSON (CRDs have no protobuf encoding: JSON for those).
func kubeClients(base *rest.Config) (kubernetes.Interface, versioned.Interface, error) {
	rc := rest.CopyConfig(base)
	rc.UserAgent = "seine-node"
	rc.QPS, rc.Burst = 50, 100
	pb := rest.CopyConfig(rc)
	pb.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pb.ContentType = "application/vnd.kubernetes.protobuf"
	kube, err := kubernetes.NewForConfig(pb)
	if err != nil {
		return nil, nil, err
	}
	cp, err := versioned.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return kube, cp, nil
}

// waitForNode polls the Node until it exists and, when needPodCIDR, until
// kube-controller-manager (or whoever runs node IPAM) has set its podCIDR.
func waitForNode(ctx context.Context, kube kubernetes.Interface, name string, needPodCIDR bool, log *zap.Logger) (*corev1.Node, error) {
	var node *corev1.Node
	last := time.Time{}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || needPodCIDR && n.Spec.PodCIDR == "" {
			if time.Since(last) > 10*time.Second {
				last = time.Now()
				log.Info("waiting for this Node's podCIDR", zap.NamedError("last_error", err))
			}
			return false, nil
		}
		node = n
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for node %s to have a podCIDR: %w", name, err)
	}
	return node, nil
}

// setupNetdevTransport attaches the transport device to the transport
// bridge (attachNetdevTransport) and keeps a NORMAL flow on it.
func setupNetdevTransport(ctx context.Context, cfg config.Config, ovs *ovsdb.Client, nodeIP net.IP, log *zap.Logger) (tunnel.Transport, error) {
	t, err := attachNetdevTransport(ctx, cfg, ovs, nodeIP, log)
	if err != nil {
		return t, err
	}
	normal := []of.FlowMod{{Op: of.OpAdd, Flow: of.Flow{Table: 0, Priority: 0,
		Actions: []of.Action{of.Output{Port: of.PortNormal}}}}}
	mgmt := filepath.Join(cfg.OVSRunDir, cfg.TransportBridge+".mgmt")
	var phy *of.Client
	phy, err = of.Dial(ctx, mgmt, log.Named("openflow-transport"), of.WithOnReconnect(func(ctx context.Context) error {
		return phy.Apply(ctx, normal)
	}))
	if err != nil {
		return t, fmt.Errorf("OpenFlow connection to %s: %w", mgmt, err)
	}
	go func() { <-ctx.Done(); phy.Close() }()
	if err := phy.Apply(ctx, normal); err != nil {
		return t, fmt.Errorf("transport bridge flows: %w", err)
	}
	// The moved addresses are the transport's; report the physical MTU.
	return t, nil
}

// attachNetdevTransport hands the transport device to the transport
// bridge (tunnel.AttachNetdev). It is idempotent, and runs again whenever
// ovs-vswitchd comes back: a seine-ovs Pod that stopped gave the device back
// to the kernel (tunnel.DetachNetdev).
func attachNetdevTransport(ctx context.Context, cfg config.Config, ovs *ovsdb.Client, nodeIP net.IP, log *zap.Logger) (tunnel.Transport, error) {
	t, err := tunnel.FindTransport(cfg.TransportInterface, nodeIP)
	if err != nil {
		return t, err
	}
	device, err := tunnel.ResolveNetdevTransport(ctx, ovs, cfg.TransportBridge, t)
	if err != nil {
		return t, err
	}
	nft, err := knftables.New(knftables.NetDevFamily, tunnel.TransportTable)
	if err != nil {
		return t, fmt.Errorf("nftables: %w", err)
	}
	return tunnel.AttachNetdev(ctx, ovs, nft, cfg.TransportBridge, device, log)
}

// setupGateway gives the gateway interface the first IP of the podCIDR
// (none when gwIP is nil), mtu (the tunnel MTU: the host reaches other
// Nodes' Pods through it), and brings it up; it returns the
// gateway's MAC.
func setupGateway(name string, gwIP net.IP, podCIDR *net.IPNet, mtu int) (net.HardwareAddr, error) {
	var link netlink.Link
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) {
			var err error
			link, err = netlink.LinkByName(name)
			return err == nil, nil
		})
	if err != nil {
		return nil, fmt.Errorf("gateway interface %s did not appear: %w", name, err)
	}
	if gwIP != nil {
		ones, _ := podCIDR.Mask.Size()
		if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: &net.IPNet{IP: gwIP, Mask: net.CIDRMask(ones, 32)}}); err != nil {
			return nil, fmt.Errorf("address of %s: %w", name, err)
		}
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("MTU of %s: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bringing up %s: %w", name, err)
	}
	link, err = netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	return link.Attrs().HardwareAddr, nil
}

// setSysctls enables IPv4 forwarding and relaxes reverse-path filtering to
// loose mode (RFC 3704 section 2.3): Pod-to-peer-Node traffic leaves
// through the transport and its replies come back through the tunnel and
// the gateway.
func setSysctls(gateway string) error {
	for path, v := range map[string]string{
		"/proc/sys/net/ipv4/ip_forward":                          "1",
		"/proc/sys/net/ipv4/conf/all/rp_filter":                  "2",
		"/proc/sys/net/ipv4/conf/" + gateway + "/rp_filter":      "2",
		"/proc/sys/net/ipv4/conf/" + gateway + "/send_redirects": "0",
		// The kernel sends redirects when either "all" or the device
		// allows it (ip-sysctl.rst, send_redirects). Packets the bridge
		// hands to the host often leave through the gateway again; a
		// redirect for them also resets the per-host ICMP rate limit, so
		// the port-unreachable answering a Service without endpoints
		// would be suppressed. CIS benchmarks ask for 0 anyway.
		"/proc/sys/net/ipv4/conf/all/send_redirects": "0",
	} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", path, err)
		}
	}
	return nil
}

// startHostPorts returns the Mapper that serves the Pods' hostPorts, its
// table written (nil, and the table removed, when a primary CNI owns the
// Pods: its conflist chains portmap).
func startHostPorts(ctx context.Context, ownsPods bool, cfg hostport.Config) (podnet.HostPortMapper, error) {
	nft, err := hostport.NewNFTables()
	if err != nil {
		return nil, err
	}
	if !ownsPods {
		return nil, hostport.Cleanup(ctx, nft)
	}
	m := hostport.New(nft, cfg)
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// errMeterReplay stops the daemon (see Run).
var errMeterReplay = errors.New("the restarted ovs-vswitchd refuses Pod egress meters, so their flows cannot be replayed; seine restarts, and those Pods keep their qdisc alone")

// podMeters returns the meters that back up Pods' egress limits, or nil
// (and says why at warning level) when the bridge's datapath has none,
// or too few for one per address of podCIDR; chained, the primary's chain
// shapes instead.
func podMeters(ctx context.Context, ownsPods bool, podCIDR *net.IPNet, ofc *of.Client, log *zap.Logger) podnet.Meters {
	if !ownsPods || podCIDR == nil {
		return nil
	}
	const why = "a Pod with CAP_NET_ADMIN can lift its own egress limit"
	f, err := ofc.MeterFeatures(ctx)
	if err != nil {
		log.Warn("reading the bridge's meter features failed; Pods get no egress meters: "+why, zap.Error(err))
		return nil
	}
	ones, bits := podCIDR.Mask.Size()
	if !f.Usable(uint32(min(1<<(bits-ones), maxOFPort))) {
		log.Warn("the datapath has no meters for Pod egress limits: "+why,
			zap.Uint32("max_meter", f.MaxMeter), zap.Bool("drop_band", f.DropBand), zap.Bool("kbps", f.Kbps), zap.Bool("burst", f.Burst))
		return nil
	}
	return ofc
}

// maxOFPort is the largest port number of a physical port (OpenFlow 1.3
// section 7.2.1, OFPP_MAX is 0xffffff00; OVS gives ports at most 0xfeff):
// the most Pods one bridge can hold, and so the most meters it needs.
const maxOFPort = 0xfeff

// chainedCheck fails until seine is in the primary CNI's conflist at path
// (networkPolicyOnly), naming the file and why.
func chainedCheck(path string) error {
	ok, err := install.Chained(path)
	switch {
	case err != nil:
		return fmt.Errorf("seine is not chained into %s: %w", path, err)
	case !ok:
		return fmt.Errorf("seine is not chained into %s (yet)", path)
	}
	return nil
}

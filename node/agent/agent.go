// Package agent is the seine node daemon: it brings up this Node's bridge,
// gateway and tunnel, programs the pipeline, restores the Pods already
// attached, connects peer Nodes, masquerades Pod egress, and serves the CNI
// plugin. Run is its only entry point.
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
	"github.com/seine-net/seine/node/hostport"
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
func Run(ctx context.Context, cfg config.Config, log *zap.Logger, opts ...Option) (err error) {
	ctx, fail := context.WithCancelCause(ctx)
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, errMeterReplay) {
			err = cause
		}
		fail(nil)
	}()
	log = log.With(zap.String("node", cfg.NodeName))
	reg := prometheus.NewRegistry()
	rc, err := restConfig(cfg.Kubeconfig, cfg.KubeAPIServerOverride)
	if err != nil {
		return err
	}
	errc := make(chan error, 16)
	ops, err := newOperations(cfg, rc, reg, log, opts)
	if err != nil {
		return err
	}
	// Health first: /healthz answers while the daemon waits for the API
	// server, OVS or its podCIDR (when the address to serve on is known
	// before the Node is: see startProbes).
	probesUp, err := ops.startProbes(ctx, nil, errc)
	if err != nil {
		return err
	}
	kube, cp, err := kubeClients(rc)
	if err != nil {
		return err
	}
	ownsPods := cfg.TrafficEncapMode.OwnsPodNetwork()
	node, err := waitForNode(ctx, kube, cfg.NodeName, ownsPods, log)
	if err != nil {
		return err
	}
	nodeIP := noderoute.InternalIP(node)
	if nodeIP == nil {
		return fmt.Errorf("node %s has no IPv4 InternalIP", cfg.NodeName)
	}
	var podCIDR *net.IPNet // the primary CNI's business in networkPolicyOnly mode
	if ownsPods {
		_, podCIDR, err = net.ParseCIDR(node.Spec.PodCIDR)
		if err != nil || podCIDR.IP.To4() == nil {
			return fmt.Errorf("node %s: podCIDR %q is not an IPv4 CIDR", cfg.NodeName, node.Spec.PodCIDR)
		}
	}
	_, clusterCIDR, _ := net.ParseCIDR(cfg.ClusterCIDR)
	log.Info("node found", zap.String("node_ip", nodeIP.String()), zap.Stringer("pod_cidr", podCIDR),
		zap.String("traffic_encap_mode", string(cfg.TrafficEncapMode)), zap.Bool("snat", cfg.SNATEnabled()))
	if !probesUp {
		if _, err := ops.startProbes(ctx, nodeIP, errc); err != nil {
			return err
		}
	}

	ovs, err := dialOVSDB(ctx, cfg.OVSDBEndpoint(), log)
	if err != nil {
		return err
	}
	defer ovs.Close()
	if cfg.TunnelType, err = chooseTunnelType(ctx, cfg, ovs, ops.ops, log); err != nil {
		return err
	}
	ops.cfg.TunnelType = cfg.TunnelType

	// Transport and MTU.
	if userspaceDatapath(cfg) {
		if err := setUserspaceTSO(ctx, cfg, ovs, log); err != nil {
			return err
		}
		EnsureNetdevReceiveBuffer(cfg, log)
	}
	tunnelKind := tunnel.Choose(userspaceDatapath(cfg), cfg.TunnelType)
	transport, err := setupTransport(ctx, cfg, tunnelKind, ovs, nodeIP, log)
	if err != nil {
		return err
	}
	mtu, err := podMTUs(cfg, transport)
	if err != nil {
		return err
	}
	log.Info("transport", zap.String("interface", transport.Name), zap.Int("transport_mtu", transport.MTU),
		zap.Int("pod_mtu", mtu.Pod), zap.Int("tunnel_mtu", mtu.Tunnel), zap.String("tunnel_type", cfg.TunnelType))

	// Bridge, with a new cookie round.
	round := uint16(1)
	if ids, err := ovs.BridgeExternalIDs(ctx, cfg.BridgeName); err == nil {
		if r, err := strconv.ParseUint(ids[extIDRound], 10, 16); err == nil {
			round = uint16(r) + 1
			if round == 0 {
				round = 1
			}
		}
	}
	prevRound := round - 1
	if err := ovs.EnsureBridge(ctx, ovsdb.BridgeConfig{
		Name:         cfg.BridgeName,
		DatapathType: cfg.OVSDatapathType,
		ExternalIDs:  map[string]string{extIDRound: strconv.Itoa(int(round))},
		TableNames:   pipeline.TableNames(),
	}); err != nil {
		return fmt.Errorf("bridge %s: %w", cfg.BridgeName, err)
	}
	tunPort, kernelTunnel, err := tunnelPort(ctx, cfg, tunnelKind, ovs, nodeIP, mtu.Tunnel)
	if err != nil {
		return err
	}
	gwPort, err := ovs.EnsurePort(ctx, cfg.BridgeName, ovsdb.PortSpec{
		Name: cfg.GatewayName, Type: "internal", OFPortRequest: GatewayOFPort, MTURequest: mtu.Tunnel,
	})
	if err != nil {
		return fmt.Errorf("gateway port: %w", err)
	}
	var gwIP net.IP
	if ownsPods {
		gwIP = noderoute.FirstIP(podCIDR)
	} else if err := clearGatewayAddresses(cfg.GatewayName); err != nil {
		return err
	}
	gwMAC, err := setupGateway(cfg.GatewayName, gwIP, podCIDR, mtu.Tunnel)
	if err != nil {
		return err
	}
	if err := setSysctls(cfg.GatewayName); err != nil {
		return err
	}
	// Userspace TSO is in effect only if ovs-vswitchd started with it.
	tso := false
	if userspaceDatapath(cfg) {
		if tso, err = offload.UserspaceTSOActive(cfg.GatewayName); err != nil {
			return err
		}
		if cfg.UserspaceTSOEnabled() && !tso {
			log.Warn("ovs-vswitchd runs without userspace TSO: Pods get checksum offload off and traffic crosses the bridge one MTU-sized packet at a time until ovs-vswitchd restarts")
		}
	}

	// OpenFlow and the pipeline.
	var syncer *flowsync.Syncer
	var replayProxy atomic.Pointer[proxy.Proxier] // set once the proxy exists
	var podBackend atomic.Pointer[podnet.Backend] // set once the backend exists, before it restores Pods
	var seedAgain atomic.Pointer[seedKeeper]      // set once the bridge is known
	ofc, err := of.Dial(ctx, cfg.BridgeMgmtSocket(), log.Named("openflow"),
		of.WithOnReconnect(func(ctx context.Context) error {
			log.Warn("OpenFlow connection re-established; replaying all groups and flows")
			if cfg.OVSDatapathType == config.DatapathNetdev && cfg.TrafficEncapMode.UsesTunnel() && tunnelKind == tunnel.KindOVSPort {
				if _, err := attachNetdevTransport(ctx, cfg, ovs, nodeIP, log); err != nil {
					return fmt.Errorf("attaching the transport again: %w", err)
				}
			}
			// Before the flows, which send NATed packets out directly. The
			// filters outlive ovs-vswitchd (its taps persist); this is for
			// a device it made anew. A failure must not hold up the flows:
			// the keeper logs it, exports it and tries again.
			if k := seedAgain.Load(); k != nil {
				k.ensure()
			}
			if p := replayProxy.Load(); p != nil {
				if err := p.ReplayGroups(ctx); err != nil {
					return fmt.Errorf("replaying service groups: %w", err)
				}
			}
			// Before the flows that use them.
			if b := podBackend.Load(); b != nil {
				if err := b.ReplayMeters(ctx); err != nil {
					err = fmt.Errorf("%w: %w", errMeterReplay, err)
					log.Error("stopping", zap.Error(err))
					fail(err)
					return err
				}
			}
			if err := syncer.Replay(ctx); err != nil {
				return err
			}
			// Shaping comes after forwarding, and never holds it up.
			if b := podBackend.Load(); b != nil {
				if err := b.ReshapePods(ctx); err != nil {
					log.Error("shaping Pod traffic again after ovs-vswitchd restarted", zap.Error(err))
				}
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("OpenFlow connection to %s: %w", cfg.BridgeMgmtSocket(), err)
	}
	defer ofc.Close()
	syncer = flowsync.New(ofc)
	bridge := pipeline.Bridge{
		Round:       round,
		GatewayPort: uint32(gwPort.OFPort),
		GatewayMAC:  gwMAC,
		GatewayIP:   gwIP,
		PodCIDR:     podCIDR,
		NodeIP:      nodeIP,
		TunnelPort:  tunPort,
		PolicyOnly:  !ownsPods,
	}
	// The segmentation port, where the tunnel needs it, before the checksum
	// seed program, which hooks it too; where only the NAT checksum detour
	// needs it, after the program, once the kernel has refused it. A port
	// an earlier run left and this one does not need goes once its flows
	// have (below).
	tunnelEgress(cfg, tunnelKind, tso, &bridge)
	if tunnelSegments(bridge) {
		if err := addSegmentPort(ctx, cfg, ovs, mtu.Tunnel, &bridge); err != nil {
			return err
		}
	}
	seed := partialChecksums(cfg, tunnelKind, tso, &bridge, log)
	if segmentPortNeeded(cfg, tso, bridge) && bridge.SegmentPort == 0 {
		if err := addSegmentPort(ctx, cfg, ovs, mtu.Tunnel, &bridge); err != nil {
			return err
		}
	}
	if seed != nil {
		keeper := newSeedKeeper(seed, seedHooks(cfg, tunnelKind, bridge), reg, log)
		defer keeper.close()
		seedAgain.Store(keeper)
		go keeper.run(ctx, 30*time.Second)
	}
	registerNATChecksumMetric(reg, bridge)
	if cfg.TrafficEncapMode.UsesTunnel() {
		log.Info("tunnel", zap.String("kind", tunnelKind.String()), zap.Stringer("egress", bridge.Tunnel),
			zap.Bool("userspace_tso", tso))
	}
	baseFlows := append(pipeline.BaseFlows(bridge), pipeline.TraceFlows(bridge)...)
	if cfg.PolicyEnabled() {
		baseFlows = append(baseFlows, pipeline.PolicyBaseFlows(bridge)...)
	}
	if err := syncer.Set(ctx, "pipeline", baseFlows); err != nil {
		return err
	}

	// The Service proxy first: it needs only the bridge and the pipeline,
	// and its informers' initial lists and its programming overlap the
	// rest of the start-up.
	var svcProxy *proxy.Proxier
	if cfg.ProxyEnabled() {
		npAddrs := cfg.NodePortCIDRs()
		if len(npAddrs) == 0 {
			npAddrs = []*net.IPNet{{IP: nodeIP.To4(), Mask: net.CIDRMask(32, 32)}}
		}
		_, svcCIDR, _ := net.ParseCIDR(cfg.ServiceCIDR)
		pcfg := proxy.Config{NodeName: cfg.NodeName, Bridge: bridge,
			SkipServices: cfg.Proxy.SkipServices, ProxyAll: cfg.ProxyAllEnabled(), Gateway: cfg.GatewayName,
			ServiceCIDR: svcCIDR, NodePortAddresses: npAddrs, Registry: reg}
		if gwIP == nil {
			pcfg.RouteSource = nodeIP // the gateway has no address of its own
		}
		svcProxy, err = proxy.New(kube, syncer, ofc, pcfg, log.Named("proxy"))
		if err != nil {
			return err
		}
		replayProxy.Store(svcProxy)
		go func() { errc <- svcProxy.Run(ctx) }()
	} else if err := proxy.Cleanup(ctx, cfg.GatewayName, ofc); err != nil {
		log.Warn("removing the leftovers of the Service proxy failed", zap.Error(err))
	}

	// NetworkPolicy: this Node's agent (enforcement) and its instance of
	// the leader-elected controller.
	var policyAgent *policyagent.Agent
	var backend *podnet.Backend // set below; the agent runs only after that
	if cfg.PolicyEnabled() {
		policyAgent = policyagent.New(cp, policyagent.Config{
			NodeName:       cfg.NodeName,
			Bridge:         bridge,
			Flows:          syncer,
			RealizeTimeout: cfg.NetworkPolicy.RealizeTimeout.Duration,
			OnIsolation: func(ctx context.Context, namespace, name string, ingress, egress bool) error {
				return backend.SetIsolation(ctx, namespace, name, ingress, egress)
			},
			AfterChange: ovsctl.New(cfg.OVSRunDir).PurgeDatapathFlows,
		}, log.Named("policy-agent"))
	}

	// Pods already attached.
	var alloc *ipam.Allocator
	if ownsPods {
		var reset bool
		alloc, reset, err = ipam.Open(filepath.Join(cfg.DataDir, "ipam"), podCIDR)
		if err != nil {
			return err
		}
		if reset {
			log.Warn("podCIDR changed since the last run: previous IP allocations discarded")
		}
	}
	hostPorts, err := startHostPorts(ctx, ownsPods, hostport.Config{Gateway: cfg.GatewayName, ClusterCIDR: clusterCIDR})
	if err != nil {
		return err
	}
	meters := podMeters(ctx, ownsPods, podCIDR, ofc, log)
	backend = podnet.New(podnet.Config{
		BridgeName:        cfg.BridgeName,
		Bridge:            bridge,
		MTU:               mtu.Pod,
		RouteMTU:          mtu.Tunnel,
		DisableTxChecksum: userspaceDatapath(cfg) && !tso,
		Policy:            policyHook(policyAgent),
		Chained:           !ownsPods,
		Gateway:           cfg.GatewayName,
		NodeIP:            nodeIP,
		Metrics:           reg,
		HostPorts:         hostPorts,
		Meters:            meters,
	}, alloc, ovs, syncer, log.Named("podnet"))
	// Before the restore, which installs flows through meters: a
	// reconnect meanwhile must put those meters back.
	podBackend.Store(backend)
	restored, err := backend.RestorePods(ctx)
	if err != nil {
		return fmt.Errorf("restoring Pods: %w", err)
	}
	log.Info("restored attached Pods", zap.Int("pods", restored))
	ops.podsGate.Open()

	// SNAT and peers.
	nft, err := snat.NewNFTables()
	if err != nil {
		return err
	}
	masq := snat.New(nft, clusterCIDR, cfg.GatewayName, cfg.SNATEnabled())
	factory := informers.NewSharedInformerFactory(kube, 0)
	rcfg := noderoute.Config{NodeName: cfg.NodeName, Mode: cfg.TrafficEncapMode, Transport: transport.Name,
		Gateway: cfg.GatewayName, Bridge: bridge, Flows: syncer}
	if ownsPods {
		masq.SetNodeIP(cfg.NodeName, nodeIP)
		if err := masq.Sync(ctx); err != nil {
			return err
		}
		rcfg.SNAT = masq
	} else if err := masq.Cleanup(ctx); err != nil {
		return err
	}
	rcfg.Tunnel = peerTunnel(kernelTunnel)
	if cfg.OVSDatapathType == config.DatapathNetdev && cfg.TrafficEncapMode.UsesTunnel() && tunnelKind == tunnel.KindOVSPort {
		rcfg.Neighbors = &tunnel.Neighbors{Bridge: cfg.TransportBridge, Appctl: ovsctl.New(cfg.OVSRunDir)}
	}
	routes, err := noderoute.New(factory.Core().V1().Nodes(), rcfg, log.Named("noderoute"))
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())

	go func() { errc <- routes.Run(ctx) }()
	if policyAgent != nil {
		go func() { errc <- policyAgent.Run(ctx) }()
		// The leader writes every computed object of the cluster: its own
		// client and rate limit, so a cold start of a large cluster is not
		// throttled to the agent's 50 requests per second.
		crc := rest.CopyConfig(rc)
		crc.UserAgent = "seine-policy-controller"
		crc.QPS, crc.Burst = cfg.NetworkPolicy.ControllerQPS, cfg.NetworkPolicy.ControllerBurst
		ccp, err := versioned.NewForConfig(crc)
		if err != nil {
			return err
		}
		pc, err := policycontroller.New(kube, ccp, policycontroller.Config{
			Identity:       cfg.NodeName,
			LeaseNamespace: cfg.LeaderElection.Namespace,
			LeaseName:      cfg.LeaderElection.Name,
			LeaseDuration:  cfg.LeaderElection.LeaseDuration.Duration,
			RenewDeadline:  cfg.LeaderElection.RenewDeadline.Duration,
			RetryPeriod:    cfg.LeaderElection.RetryPeriod.Duration,
			SliceSize:      cfg.NetworkPolicy.AddressGroupSliceSize,
			Workers:        cfg.NetworkPolicy.ControllerWorkers,
			Registry:       reg,
			Ops:            ops.ops,
		}, log.Named("policy-controller"))
		if err != nil {
			return err
		}
		ops.leaderTasks(pc, kube, cp)
		go func() { errc <- pc.Run(ctx) }()
	}
	synced := factory.WaitForCacheSync(ctx.Done())
	for typ, ok := range synced {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	// Let the route controller install every known peer before the old
	// round's flows go away.
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(routes.Peers()) >= countPeers(factory, cfg.NodeName) && (svcProxy == nil || svcProxy.Synced()), nil
	})
	if prevRound != 0 {
		if err := ofc.DeleteMatching(ctx, uint64(prevRound)<<pipeline.CookieRoundShift, pipeline.CookieRoundMask); err != nil {
			return fmt.Errorf("removing flows of round %d: %w", prevRound, err)
		}
	}
	// Only now that no earlier round's flow sends NATed packets out
	// directly (the Services' flows save their headers again, if this
	// round takes the detour).
	if !bridge.PartialChecksumsRewritten {
		detachSeed(cfg, log)
	}
	// Likewise the segmentation port, which an earlier round's flows may
	// send packets through; left behind, it is only idle. Also on the
	// kernel datapath, which never adds it: a Node moved there from the
	// userspace one removes it (nothing to do, and no error, without it).
	if bridge.SegmentPort == 0 {
		if err := removeSegmentPort(ctx, cfg, ovs); err != nil {
			log.Warn("the segmentation port is not needed and could not be removed; ovs-vswitchd keeps reading it",
				zap.String("interface", tunnel.DefaultSegmentPair.Port), zap.Error(err))
		}
	}
	// An ovs-vswitchd restarted with the kernel datapath held its old
	// flows until now (see datapath/ovsdaemon).
	if err := ovs.ClearFlowRestoreWait(ctx); err != nil {
		return err
	}
	log.Info("datapath ready", zap.Uint16("round", round), zap.Int("flows", syncer.Count()))
	ops.pipelineGate.Open()

	// Metrics and health.
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "seine_pod_ips_allocated", Help: "Pod IPs allocated from this Node's podCIDR.",
	}, func() float64 {
		if alloc == nil {
			return 0
		}
		return float64(len(alloc.List()))
	}))
	registerModeMetrics(reg, cfg, routes)
	if !ownsPods {
		go func() {
			errc <- install.KeepChained(ctx, cfg.PrimaryCNIConflist, cfg.CNISocket, log.Named("cni-chain"))
		}()
	}
	dp := &datapath{bridge: bridge, ovs: ovs, ofc: ofc, appctl: ovsctl.New(cfg.OVSRunDir), flows: syncer, pods: backend,
		policy: policyAgent, routes: routes, factory: factory, kube: kube, nodeUID: node.UID}
	if err := ops.datapathUp(dp); err != nil {
		return err
	}

	backend.MarkReady()
	srv := cniserver.New(backend, log.Named("cni"), cniserver.WithRegistry(reg))
	go func() { errc <- srv.Serve(ctx, cfg.CNISocket) }()
	ops.cniGate.Open()
	log.Info("serving CNI", zap.String("socket", cfg.CNISocket))
	ops.run(ctx, dp, errc)

	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		<-ctx.Done()
		return nil
	}
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
// DaemonSet the openvswitch container starts beside this one.
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
// ovs-vswitchd comes back: an openvswitch container that stopped gave the
// device back to the kernel (tunnel.DetachNetdev).
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

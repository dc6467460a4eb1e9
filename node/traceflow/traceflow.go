// Package traceflow runs ops.seine.io Traceflows on this Node. The Node
// whose bridge holds the source Pod injects a real packet at the Pod's
// port, marked so that every table of every Node it crosses reports it
// (see datapath/pipeline TraceFlows); every Node collects the reports of
// the packets it sees and writes what happened into the Traceflow's status.
//
// The protocol, per trace:
//
//  1. The source Node picks a tag (a number unused by its own running
//     traces), writes Running, the tag and the packet into the status,
//     then sends the packet (OpenFlow packet-out).
//  2. Each Node groups the packet-ins by (source Node IP, tag): the
//     source Node is itself for injected packets and the tunnel's source
//     address for packets from a peer. A kernel VXLAN device keeps the
//     outer header to itself, so packets through one are grouped by their
//     source IP (the source Pod's) and the tag instead. Once none came
//     for a settle time, the Node writes one TraceflowNode: the tables,
//     and Delivered, Forwarded (with the next Node), ToHost or Dropped.
//  3. The status is Succeeded once the chain of Nodes from the source
//     ends in a Node that did not forward the packet. The source Node
//     fails the trace when that did not happen within the timeout, counted
//     from the status's StartTime (so a daemon restarted mid-trace does too).
package traceflow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/packet"
	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	opsinformers "github.com/seine-net/seine/node/client/informers"
	"github.com/seine-net/seine/node/podnet"
)

// Defaults.
const (
	DefaultTimeout = 10 * time.Second
	// settle is how long a Node waits after a trace's last packet-in
	// before it reports: a packet crosses a Node's tables within
	// microseconds to milliseconds, conntrack recirculations included.
	settle = 300 * time.Millisecond
	// orphanTTL is how long reports wait for their Traceflow to show up.
	orphanTTL = 15 * time.Second
)

// Switch is the part of the OpenFlow client tracing uses.
type Switch interface {
	PacketOut(ctx context.Context, inPort uint32, actions []of.Action, data []byte) error
	SubscribePacketIns(fn func(of.PacketIn)) (cancel func())
}

// Config is what the controller needs of the daemon.
type Config struct {
	NodeName string
	NodeIP   net.IP
	Bridge   pipeline.Bridge
	Pods     interface {
		Attachment(namespace, name string) (podnet.Attachment, bool)
	}
	Switch Switch
	// Describe names where a packet output by table last to port went
	// (node/inspect.Inspector.DescribeOutput).
	Describe func(last pipeline.Table, port uint32, tunDst net.IP, dstMAC net.HardwareAddr) (action, detail string)
	// NodeByIP names the Node with the given InternalIP.
	NodeByIP func(ip net.IP) string
	// PodIP returns a Pod's IP.
	PodIP func(ctx context.Context, namespace, name string) (string, error)
	// QueueMetrics, when set, receives the metrics of the workqueue
	// (named "traceflow"), and with them its stuck items (health.QueueMetrics).
	QueueMetrics workqueue.MetricsProvider
}

// key identifies a trace cluster-wide: the source Node's IP and its tag,
// or, for a packet from a peer through a kernel VXLAN device (no tun_src:
// the device keeps the outer header), the packet's source IP and the tag.
type key struct {
	src   string // the source Node's IP
	podIP string // instead of src: the traced packet's source IP
	tag   uint16
}

// observation is what one Node collected of one trace.
type observation struct {
	tables []pipeline.Table
	last   of.PacketIn
	timer  *time.Timer
	first  time.Time
}

// Controller runs traces on this Node.
type Controller struct {
	ops opsclient.Interface
	cfg Config
	log *zap.Logger

	queue workqueue.TypedRateLimitingInterface[string]
	store cache.Store

	mu      sync.Mutex
	obs     map[key]*observation
	pending map[key]opsv1alpha1.TraceflowNode // finished hops waiting for their Traceflow
	pendAt  map[key]time.Time
	owned   map[string]ownedTrace // Traceflows this Node injected, by name
	ins     chan of.PacketIn
}

// New returns a controller; Run starts it.
func New(ops opsclient.Interface, cfg Config, log *zap.Logger) *Controller {
	return &Controller{ops: ops, cfg: cfg, log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "traceflow", MetricsProvider: cfg.QueueMetrics}),
		obs: map[key]*observation{}, pending: map[key]opsv1alpha1.TraceflowNode{}, pendAt: map[key]time.Time{},
		owned: map[string]ownedTrace{}, ins: make(chan of.PacketIn, 4096)}
}

// Run watches Traceflows and packet-ins until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	cancel := c.cfg.Switch.SubscribePacketIns(func(pi of.PacketIn) {
		select {
		case c.ins <- pi:
		default: // a flood of marked packets: drop, never block the reader
		}
	})
	defer cancel()
	f := opsinformers.NewSharedInformerFactory(c.ops, 0)
	inf := f.Ops().V1alpha1().Traceflows().Informer()
	enqueue := func(o any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue,
		UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue}); err != nil {
		return fmt.Errorf("traceflow informer: %w", err)
	}
	c.store = inf.GetStore()
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	go c.work(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case pi := <-c.ins:
			c.observe(ctx, pi)
		case <-tick.C:
			c.expire()
		}
	}
}

func (c *Controller) work(ctx context.Context) {
	for {
		name, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		err := c.sync(ctx, name)
		c.queue.Done(name)
		if err != nil && ctx.Err() == nil {
			c.log.Debug("traceflow sync failed; retrying", zap.String("traceflow", name), zap.Error(err))
			c.queue.AddRateLimited(name)
			continue
		}
		c.queue.Forget(name)
	}
}

// sync starts the Traceflows whose source Pod is attached here, fails the
// ones it owns past their deadline, and writes waiting reports.
func (c *Controller) sync(ctx context.Context, name string) error {
	o, exists, err := c.store.GetByKey(name)
	if err != nil || !exists {
		c.mu.Lock()
		delete(c.owned, name)
		c.mu.Unlock()
		return err
	}
	tf := o.(*opsv1alpha1.Traceflow)
	switch tf.Status.Phase {
	case "":
		if _, local := c.cfg.Pods.Attachment(tf.Spec.Source.Namespace, tf.Spec.Source.Pod); local {
			return c.start(ctx, tf)
		}
	case opsv1alpha1.TraceflowRunning:
		if tf.Status.SourceNode == c.cfg.NodeName {
			end := c.deadline(tf)
			if !time.Now().Before(end) {
				return c.fail(ctx, tf, timeoutReason(tf))
			}
			c.queue.AddAfter(name, time.Until(end)+10*time.Millisecond)
		}
		return c.flushPending(ctx, tf)
	default: // Succeeded or Failed: no deadline left to keep
		c.mu.Lock()
		delete(c.owned, name)
		c.mu.Unlock()
	}
	return nil
}

// deadline is when the source Node fails a Running trace of its own. The
// object holds it (StartTime + the timeout), so a daemon that restarted
// mid-trace still fails the trace and frees its tag; owned only caches
// the exact instant of the traces started by this run.
func (c *Controller) deadline(tf *opsv1alpha1.Traceflow) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.owned[tf.Name]; ok && d.uid == tf.UID {
		return d.at
	}
	start := tf.CreationTimestamp.Time
	if tf.Status.StartTime != nil {
		start = tf.Status.StartTime.Time
	}
	d := ownedTrace{uid: tf.UID, at: start.Add(traceTimeout(tf))}
	c.owned[tf.Name] = d
	return d.at
}

// ownedTrace is when a trace of this Node fails, for the object uid.
type ownedTrace struct {
	uid types.UID
	at  time.Time
}

// traceTimeout is the trace's timeoutSeconds, or DefaultTimeout when unset.
func traceTimeout(tf *opsv1alpha1.Traceflow) time.Duration {
	if tf.Spec.TimeoutSeconds > 0 {
		return time.Duration(tf.Spec.TimeoutSeconds) * time.Second
	}
	return DefaultTimeout
}

func timeoutReason(tf *opsv1alpha1.Traceflow) string {
	if n := len(tf.Status.Nodes); n > 0 {
		last := tf.Status.Nodes[n-1]
		if last.Action == opsv1alpha1.TraceForwarded {
			return fmt.Sprintf("the packet was forwarded to Node %s, which reported nothing in time", last.NextNode)
		}
	}
	return "no Node reported the packet in time"
}

// checkSpec refuses what the Traceflow CRD's schema refuses, for objects
// that did not pass it (stored before the schema had its bounds): a port
// outside 0..65535 would wrap into another one in the packet, a negative
// timeout would silently become the default. It names each bad field.
func checkSpec(s opsv1alpha1.TraceflowSpec) error {
	var bad []string
	for _, p := range []struct {
		field string
		v     int32
	}{{"packet.srcPort", s.Packet.SrcPort}, {"packet.dstPort", s.Packet.DstPort}} {
		if p.v < 0 || p.v > 65535 {
			bad = append(bad, fmt.Sprintf("%s %d is not in 0..65535", p.field, p.v))
		}
	}
	if s.TimeoutSeconds < 0 {
		bad = append(bad, fmt.Sprintf("timeoutSeconds %d is negative (0 means the default, %s)", s.TimeoutSeconds, DefaultTimeout))
	}
	if (s.Destination.Pod != "") == (s.Destination.IP != "") {
		bad = append(bad, "destination: set exactly one of pod and ip")
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// start injects the packet of a new Traceflow.
func (c *Controller) start(ctx context.Context, tf *opsv1alpha1.Traceflow) error {
	if err := checkSpec(tf.Spec); err != nil {
		return c.fail(ctx, tf, err.Error())
	}
	src, _ := c.cfg.Pods.Attachment(tf.Spec.Source.Namespace, tf.Spec.Source.Pod)
	probe, err := c.probe(ctx, tf, src)
	if err != nil {
		return c.fail(ctx, tf, err.Error())
	}
	frame, err := packet.Build(probe)
	if err != nil {
		return c.fail(ctx, tf, err.Error())
	}
	timeout := traceTimeout(tf)
	c.mu.Lock()
	tag := c.freeTagLocked()
	c.mu.Unlock()
	now := metav1.Now()
	tf = tf.DeepCopy()
	tf.Status = opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowRunning, SourceNode: c.cfg.NodeName, Tag: int32(tag),
		StartTime: &now, Packet: &opsv1alpha1.TracedPacket{SrcIP: probe.SrcIP.String(), DstIP: probe.DstIP.String(),
			Protocol: protocolName(probe.Protocol), SrcPort: int32(probe.SrcPort), DstPort: int32(probe.DstPort)}}
	// The update carries the resourceVersion read: if another Node or a
	// user changed the Traceflow meanwhile, nothing is injected.
	if _, err := c.ops.OpsV1alpha1().Traceflows().UpdateStatus(ctx, tf, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return nil // the informer brings the newer object
		}
		return fmt.Errorf("starting traceflow %s: %w", tf.Name, err)
	}
	c.mu.Lock()
	c.owned[tf.Name] = ownedTrace{uid: tf.UID, at: now.Add(timeout)}
	c.mu.Unlock()
	c.queue.AddAfter(tf.Name, timeout+10*time.Millisecond)
	c.log.Info("traceflow started", zap.String("traceflow", tf.Name), zap.Uint16("tag", tag),
		zap.String("src", probe.SrcIP.String()), zap.String("dst", probe.DstIP.String()))
	if err := c.cfg.Switch.PacketOut(ctx, src.OFPort, pipeline.TraceInjectActions(tag), frame); err != nil {
		return c.fail(ctx, tf, fmt.Sprintf("injecting the packet: %v", err))
	}
	return nil
}

// probe builds the packet to send.
func (c *Controller) probe(ctx context.Context, tf *opsv1alpha1.Traceflow, src podnet.Attachment) (packet.Probe, error) {
	p := packet.Probe{SrcIP: net.ParseIP(src.IP), DstMAC: c.cfg.Bridge.GatewayMAC}
	var err error
	if p.SrcMAC, err = net.ParseMAC(src.MAC); err != nil {
		return p, fmt.Errorf("source Pod MAC %q: %w", src.MAC, err)
	}
	d := tf.Spec.Destination
	switch { // exactly one of them is set (checkSpec)
	case d.IP != "":
		p.DstIP = net.ParseIP(d.IP).To4()
		if p.DstIP == nil {
			return p, fmt.Errorf("destination ip %q is not an IPv4 address", d.IP)
		}
	case d.Pod != "":
		if a, local := c.cfg.Pods.Attachment(d.Namespace, d.Pod); local {
			p.DstIP = net.ParseIP(a.IP).To4()
			if mac, err := net.ParseMAC(a.MAC); err == nil {
				p.DstMAC = mac
			}
		} else {
			ip, err := c.cfg.PodIP(ctx, d.Namespace, d.Pod)
			if err != nil {
				return p, fmt.Errorf("destination Pod %s/%s: %w", d.Namespace, d.Pod, err)
			}
			if p.DstIP = net.ParseIP(ip).To4(); p.DstIP == nil {
				return p, fmt.Errorf("destination Pod %s/%s has no IPv4 address", d.Namespace, d.Pod)
			}
		}
	default:
		return p, fmt.Errorf("destination: set exactly one of pod and ip")
	}
	switch tf.Spec.Packet.Protocol {
	case "", opsv1alpha1.ProtocolICMP:
		p.Protocol = packet.ProtoICMP
	case opsv1alpha1.ProtocolTCP, opsv1alpha1.ProtocolUDP:
		p.Protocol = packet.ProtoTCP
		if tf.Spec.Packet.Protocol == opsv1alpha1.ProtocolUDP {
			p.Protocol = packet.ProtoUDP
		}
		if tf.Spec.Packet.DstPort <= 0 || tf.Spec.Packet.DstPort > 65535 {
			return p, fmt.Errorf("packet: %s needs a dstPort in 1..65535", tf.Spec.Packet.Protocol)
		}
		p.DstPort = uint16(tf.Spec.Packet.DstPort)
		p.SrcPort = uint16(tf.Spec.Packet.SrcPort)
		if p.SrcPort == 0 {
			p.SrcPort = uint16(32768 + rand.IntN(28232)) // the Linux ephemeral range
		}
	default:
		return p, fmt.Errorf("packet: protocol %q is not ICMP, TCP or UDP", tf.Spec.Packet.Protocol)
	}
	p.ID = uint16(rand.IntN(1 << 16))
	return p, nil
}

func protocolName(p uint8) string {
	switch p {
	case packet.ProtoTCP:
		return opsv1alpha1.ProtocolTCP
	case packet.ProtoUDP:
		return opsv1alpha1.ProtocolUDP
	}
	return opsv1alpha1.ProtocolICMP
}

// freeTagLocked picks a tag no running trace of this Node uses.
func (c *Controller) freeTagLocked() uint16 {
	used := map[int32]bool{}
	for _, o := range c.store.List() {
		tf := o.(*opsv1alpha1.Traceflow)
		if tf.Status.SourceNode == c.cfg.NodeName && tf.Status.Phase == opsv1alpha1.TraceflowRunning {
			used[tf.Status.Tag] = true
		}
	}
	for {
		t := uint16(1 + rand.IntN(1<<16-1))
		if !used[int32(t)] {
			return t
		}
	}
}

// fail marks a Traceflow Failed.
func (c *Controller) fail(ctx context.Context, tf *opsv1alpha1.Traceflow, reason string) error {
	c.mu.Lock()
	delete(c.owned, tf.Name)
	c.mu.Unlock()
	c.log.Info("traceflow failed", zap.String("traceflow", tf.Name), zap.String("reason", reason))
	return c.updateStatus(ctx, tf.Name, func(st *opsv1alpha1.TraceflowStatus) bool {
		if st.Phase == opsv1alpha1.TraceflowSucceeded || st.Phase == opsv1alpha1.TraceflowFailed {
			return false
		}
		st.Phase, st.Reason = opsv1alpha1.TraceflowFailed, reason
		if st.SourceNode == "" {
			st.SourceNode = c.cfg.NodeName
		}
		return true
	})
}

// updateStatus applies change to the latest status and writes it.
func (c *Controller) updateStatus(ctx context.Context, name string, change func(*opsv1alpha1.TraceflowStatus) bool) error {
	client := c.ops.OpsV1alpha1().Traceflows()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		cur = cur.DeepCopy()
		if !change(&cur.Status) {
			return nil
		}
		_, err = client.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// observe records one packet-in.
func (c *Controller) observe(ctx context.Context, pi of.PacketIn) {
	if reg(pi.Metadata, pipeline.TraceActive) != 1 {
		return
	}
	k, ok := c.keyOf(pi)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.obs[k]
	if o == nil {
		o = &observation{first: time.Now()}
		c.obs[k] = o
		o.timer = time.AfterFunc(settle, func() { c.finish(ctx, k) })
	} else {
		o.timer.Reset(settle)
	}
	o.tables = append(o.tables, pipeline.Table(pi.Table))
	o.last = pi
}

// keyOf returns the trace a packet-in of a traced packet belongs to; ok
// is false for a packet from the tunnel that names no source (neither
// tun_src nor an IPv4 header), which no trace can claim.
func (c *Controller) keyOf(pi of.PacketIn) (k key, ok bool) {
	k = key{src: c.cfg.NodeIP.String(), tag: uint16(reg(pi.Metadata, pipeline.TraceTag))}
	if pi.Metadata.InPort != c.cfg.Bridge.TunnelPort || c.cfg.Bridge.TunnelPort == 0 {
		return k, true
	}
	if pi.Metadata.TunSrc != nil {
		k.src = pi.Metadata.TunSrc.String()
		return k, true
	}
	h, ok := packet.ParseIPv4(pi.Data)
	if !ok {
		return key{}, false
	}
	return key{podIP: h.Src.String(), tag: k.tag}, true
}

func reg(m of.Match, f pipeline.RegField) uint32 {
	for _, r := range m.Regs {
		if r.Reg == f.Reg() {
			return (r.Value & f.Mask()) >> f.Ofs()
		}
	}
	return 0
}

// finish turns a settled observation into this Node's report.
func (c *Controller) finish(ctx context.Context, k key) {
	c.mu.Lock()
	o := c.obs[k]
	delete(c.obs, k)
	c.mu.Unlock()
	if o == nil || len(o.tables) == 0 {
		return
	}
	hop := opsv1alpha1.TraceflowNode{Node: c.cfg.NodeName}
	for _, t := range o.tables {
		hop.Tables = append(hop.Tables, t.String())
	}
	last := o.tables[len(o.tables)-1]
	m := o.last.Metadata
	switch {
	case last == pipeline.Output && reg(m, pipeline.OutputResolved) == 1 && reg(m, pipeline.HairpinOut) == 1:
		hop.Action, hop.Detail = opsv1alpha1.TraceDelivered, "back to the source Pod through a Service (hairpin)"
	case last == pipeline.Output && reg(m, pipeline.OutputResolved) == 1:
		var dstMAC net.HardwareAddr
		if len(o.last.Data) >= 6 {
			dstMAC = net.HardwareAddr(o.last.Data[:6])
		}
		hop.Action, hop.Detail = c.cfg.Describe(last, reg(m, pipeline.TargetOFPort), m.TunDst, dstMAC)
		next := m.TunDst
		if next == nil {
			next = pipeline.PeerNodeIP(dstMAC) // a kernel VXLAN device: no tun_dst
		}
		if hop.Action == opsv1alpha1.TraceForwarded && next != nil && c.cfg.NodeByIP != nil {
			hop.NextNode = c.cfg.NodeByIP(next)
		}
	case last == pipeline.ServiceLB:
		hop.Action, hop.Detail = opsv1alpha1.TraceToHost, pipeline.DropReason(last)
	default:
		hop.Action, hop.Detail = opsv1alpha1.TraceDropped, fmt.Sprintf("in %s: %s", last, pipeline.DropReason(last))
	}
	c.mu.Lock()
	c.pending[k] = hop
	c.pendAt[k] = time.Now()
	c.mu.Unlock()
	for _, obj := range c.store.List() {
		tf := obj.(*opsv1alpha1.Traceflow)
		if c.matches(tf, k) {
			c.queue.Add(tf.Name)
		}
	}
}

// matches reports whether tf is the trace k.
func (c *Controller) matches(tf *opsv1alpha1.Traceflow, k key) bool {
	if tf.Status.Phase != opsv1alpha1.TraceflowRunning || tf.Status.Tag != int32(k.tag) {
		return false
	}
	if k.podIP != "" {
		return tf.Status.SourceNode != c.cfg.NodeName && tf.Status.Packet != nil && tf.Status.Packet.SrcIP == k.podIP
	}
	if tf.Status.SourceNode == c.cfg.NodeName {
		return k.src == c.cfg.NodeIP.String()
	}
	return c.cfg.NodeByIP != nil && c.cfg.NodeByIP(net.ParseIP(k.src)) == tf.Status.SourceNode
}

// flushPending writes this Node's reports of tf.
func (c *Controller) flushPending(ctx context.Context, tf *opsv1alpha1.Traceflow) error {
	c.mu.Lock()
	var hops []opsv1alpha1.TraceflowNode
	var keys []key
	for k, h := range c.pending {
		if c.matches(tf, k) {
			hops = append(hops, h)
			keys = append(keys, k)
		}
	}
	c.mu.Unlock()
	if len(hops) == 0 {
		return nil
	}
	err := c.updateStatus(ctx, tf.Name, func(st *opsv1alpha1.TraceflowStatus) bool {
		if st.Phase != opsv1alpha1.TraceflowRunning || st.Tag != tf.Status.Tag {
			return false
		}
		for _, h := range hops {
			if !slices.ContainsFunc(st.Nodes, func(n opsv1alpha1.TraceflowNode) bool { return n.Node == h.Node }) {
				st.Nodes = append(st.Nodes, h)
			}
		}
		st.Nodes = chain(st.SourceNode, st.Nodes)
		if res, done := outcome(st.SourceNode, st.Nodes); done {
			st.Phase, st.Result = opsv1alpha1.TraceflowSucceeded, res
		}
		return true
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	for _, k := range keys {
		delete(c.pending, k)
		delete(c.pendAt, k)
	}
	c.mu.Unlock()
	return nil
}

// chain orders the Nodes' reports along the packet's path from the source
// Node; reports off the path follow.
func chain(source string, nodes []opsv1alpha1.TraceflowNode) []opsv1alpha1.TraceflowNode {
	by := map[string]opsv1alpha1.TraceflowNode{}
	for _, n := range nodes {
		by[n.Node] = n
	}
	var out []opsv1alpha1.TraceflowNode
	seen := map[string]bool{}
	for cur := source; cur != "" && !seen[cur]; {
		n, ok := by[cur]
		if !ok {
			break
		}
		out = append(out, n)
		seen[cur] = true
		cur = n.NextNode
	}
	for _, n := range nodes {
		if !seen[n.Node] {
			out = append(out, n)
		}
	}
	return out
}

// outcome is the trace's result once the chain from the source ends in a
// Node that did not forward the packet.
func outcome(source string, nodes []opsv1alpha1.TraceflowNode) (string, bool) {
	if len(nodes) == 0 || nodes[0].Node != source {
		return "", false
	}
	for i, n := range nodes {
		if n.Action != opsv1alpha1.TraceForwarded {
			return n.Action, true
		}
		if i+1 >= len(nodes) || nodes[i+1].Node != n.NextNode {
			return "", false
		}
	}
	return "", false
}

// expire drops reports whose Traceflow never showed up.
func (c *Controller) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.pendAt {
		if time.Since(t) > orphanTTL {
			c.log.Debug("dropping a trace report no Traceflow claimed", zap.String("source", k.src), zap.String("pod_ip", k.podIP), zap.Uint16("tag", k.tag))
			delete(c.pending, k)
			delete(c.pendAt, k)
		}
	}
}

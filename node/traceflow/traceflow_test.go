package traceflow

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/packet"
	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsfake "github.com/seine-net/seine/node/client/clientset/versioned/fake"
	"github.com/seine-net/seine/node/podnet"
)

func hop(node, action, next string) opsv1alpha1.TraceflowNode {
	return opsv1alpha1.TraceflowNode{Node: node, Action: action, NextNode: next}
}

// The reports are ordered along the path, and the trace is done only when
// the path from the source ends in a Node that did not forward.
func TestChainAndOutcome(t *testing.T) {
	fwd, del, drop := opsv1alpha1.TraceForwarded, opsv1alpha1.TraceDelivered, opsv1alpha1.TraceDropped
	cases := []struct {
		name     string
		nodes    []opsv1alpha1.TraceflowNode
		order    []string
		result   string
		finished bool
	}{
		{"one Node", []opsv1alpha1.TraceflowNode{hop("a", del, "")}, []string{"a"}, del, true},
		{"remote reported first", []opsv1alpha1.TraceflowNode{hop("b", drop, ""), hop("a", fwd, "b")}, []string{"a", "b"}, drop, true},
		{"waiting for the next Node", []opsv1alpha1.TraceflowNode{hop("a", fwd, "b")}, []string{"a"}, "", false},
		{"source not reported yet", []opsv1alpha1.TraceflowNode{hop("b", del, "")}, []string{"b"}, "", false},
		{"off-path report last", []opsv1alpha1.TraceflowNode{hop("c", del, ""), hop("a", fwd, "b"), hop("b", del, "")}, []string{"a", "b", "c"}, del, true},
	}
	for _, tc := range cases {
		got := chain("a", tc.nodes)
		var order []string
		for _, n := range got {
			order = append(order, n.Node)
		}
		if len(order) != len(tc.order) {
			t.Errorf("%s: order %v, want %v", tc.name, order, tc.order)
			continue
		}
		for i := range order {
			if order[i] != tc.order[i] {
				t.Errorf("%s: order %v, want %v", tc.name, order, tc.order)
				break
			}
		}
		res, done := outcome("a", got)
		if res != tc.result || done != tc.finished {
			t.Errorf("%s: outcome %q %v, want %q %v", tc.name, res, done, tc.result, tc.finished)
		}
	}
}

// A Node tells which trace a reported packet belongs to: its own (injected
// here), a peer's through OVS's tunnel port (tun_src names the peer), or a
// peer's through a kernel VXLAN device, which keeps the outer header: then
// the packet's source IP, the source Pod's, names the trace.
func TestKeyAndMatch(t *testing.T) {
	nodes := map[string]string{"198.18.0.11": "n1", "198.18.0.12": "n2", "198.18.0.13": "n3"}
	c := New(nil, Config{NodeName: "n2", NodeIP: net.ParseIP("198.18.0.12"),
		Bridge:   pipeline.Bridge{TunnelPort: 1},
		NodeByIP: func(ip net.IP) string { return nodes[ip.String()] }}, zap.NewNop())
	frame, err := packet.Build(packet.Probe{SrcMAC: pipeline.TraceMAC, DstMAC: pipeline.PeerMAC(net.ParseIP("198.18.0.12")),
		SrcIP: net.ParseIP("10.244.0.5"), DstIP: net.ParseIP("10.244.1.7"), Protocol: packet.ProtoTCP, SrcPort: 40000, DstPort: 80})
	if err != nil {
		t.Fatal(err)
	}
	tagged := func(inPort uint32, tunSrc net.IP, data []byte) of.PacketIn {
		m := of.Match{InPort: inPort, TunSrc: tunSrc, Regs: []of.RegMatch{
			{Reg: pipeline.TraceTag.Reg(), Value: 77 << pipeline.TraceTag.Ofs()}}}
		return of.PacketIn{Metadata: m, Data: data}
	}
	trace := func(source, srcIP string, tag int32) *opsv1alpha1.Traceflow {
		return &opsv1alpha1.Traceflow{Status: opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowRunning,
			SourceNode: source, Tag: tag, Packet: &opsv1alpha1.TracedPacket{SrcIP: srcIP}}}
	}
	for _, tc := range []struct {
		name string
		pi   of.PacketIn
		want key
		ok   bool
	}{
		{"injected here", tagged(3, nil, frame), key{src: "198.18.0.12", tag: 77}, true},
		{"from a peer's OVS tunnel port", tagged(1, net.ParseIP("198.18.0.11"), frame), key{src: "198.18.0.11", tag: 77}, true},
		{"from a kernel VXLAN device", tagged(1, nil, frame), key{podIP: "10.244.0.5", tag: 77}, true},
		{"from the tunnel, naming no source", tagged(1, nil, frame[:20]), key{}, false},
	} {
		if got, ok := c.keyOf(tc.pi); got != tc.want || ok != tc.ok {
			t.Errorf("%s: key %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	for _, tc := range []struct {
		name string
		tf   *opsv1alpha1.Traceflow
		k    key
		want bool
	}{
		{"own trace", trace("n2", "10.244.1.3", 77), key{src: "198.18.0.12", tag: 77}, true},
		{"own tag, a peer's packet", trace("n2", "10.244.1.3", 77), key{src: "198.18.0.11", tag: 77}, false},
		{"a peer's trace by tun_src", trace("n1", "10.244.0.5", 77), key{src: "198.18.0.11", tag: 77}, true},
		{"another peer's trace by tun_src", trace("n3", "10.244.0.5", 77), key{src: "198.18.0.11", tag: 77}, false},
		{"a peer's trace by source IP", trace("n1", "10.244.0.5", 77), key{podIP: "10.244.0.5", tag: 77}, true},
		{"another source IP", trace("n1", "10.244.0.6", 77), key{podIP: "10.244.0.5", tag: 77}, false},
		{"another tag", trace("n1", "10.244.0.5", 78), key{podIP: "10.244.0.5", tag: 77}, false},
		{"by source IP, but the trace is this Node's", trace("n2", "10.244.0.5", 77), key{podIP: "10.244.0.5", tag: 77}, false},
	} {
		if got := c.matches(tc.tf, tc.k); got != tc.want {
			t.Errorf("%s: matches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

type onePod struct{ a podnet.Attachment }

func (p onePod) Attachment(namespace, name string) (podnet.Attachment, bool) {
	return p.a, namespace == p.a.Namespace && name == p.a.Name
}

type nullSwitch struct{}

func (nullSwitch) PacketOut(context.Context, uint32, []of.Action, []byte) error { return nil }
func (nullSwitch) SubscribePacketIns(func(of.PacketIn)) func()                  { return func() {} }

// specCase is a Traceflow spec, the valid one changed; field names the
// refused field ("" when valid), value its bad value.
type specCase struct {
	name         string
	change       func(*opsv1alpha1.TraceflowSpec)
	field, value string
}

// validSpec traces TCP to port 80 of an IP from default/client.
func validSpec() opsv1alpha1.TraceflowSpec {
	return opsv1alpha1.TraceflowSpec{Source: opsv1alpha1.TraceflowSource{Namespace: "default", Pod: "client"},
		Destination: opsv1alpha1.TraceflowDestination{IP: "10.244.1.7"},
		Packet:      opsv1alpha1.TraceflowPacket{Protocol: opsv1alpha1.ProtocolTCP, DstPort: 80}}
}

// specCases are refused alike by the CRD's schema and by the daemon.
func specCases() []specCase {
	return []specCase{
		{"in bounds", func(*opsv1alpha1.TraceflowSpec) {}, "", ""},
		{"srcPort beyond 65535", func(s *opsv1alpha1.TraceflowSpec) { s.Packet.SrcPort = 70000 }, "packet.srcPort", "70000"},
		{"negative srcPort", func(s *opsv1alpha1.TraceflowSpec) { s.Packet.SrcPort = -1 }, "packet.srcPort", "-1"},
		{"dstPort beyond 65535 with ICMP", func(s *opsv1alpha1.TraceflowSpec) {
			s.Packet = opsv1alpha1.TraceflowPacket{Protocol: opsv1alpha1.ProtocolICMP, DstPort: 65536}
		}, "packet.dstPort", "65536"},
		{"negative timeout", func(s *opsv1alpha1.TraceflowSpec) { s.TimeoutSeconds = -5 }, "timeoutSeconds", "-5"},
		{"pod and ip", func(s *opsv1alpha1.TraceflowSpec) { s.Destination.Pod = "server" }, "destination", ""},
		{"neither pod nor ip", func(s *opsv1alpha1.TraceflowSpec) { s.Destination.IP = "" }, "destination", ""},
	}
}

// The source Node refuses a spec the CRD's schema refuses (an object
// stored before the schema had its bounds) rather than inject a different
// packet: it marks the trace Failed, the reason naming the field. A port
// beyond 65535 would wrap in the packet; a negative timeout would silently
// become the default.
func TestStartRefusesOutOfBoundsSpec(t *testing.T) {
	gw, _ := net.ParseMAC("0a:00:00:00:00:01")
	src := podnet.Attachment{Namespace: "default", Name: "client", OFPort: 5, IP: "10.244.0.5", MAC: "0a:00:00:00:00:05"}
	for _, tc := range specCases() {
		t.Run(tc.name, func(t *testing.T) {
			tf := &opsv1alpha1.Traceflow{ObjectMeta: metav1.ObjectMeta{Name: "tf"}, Spec: validSpec()}
			tc.change(&tf.Spec)
			ops := opsfake.NewSimpleClientset(tf)
			c := New(ops, Config{NodeName: "n1", NodeIP: net.ParseIP("198.18.0.11"), Bridge: pipeline.Bridge{GatewayMAC: gw},
				Pods: onePod{src}, Switch: nullSwitch{}}, zap.NewNop())
			c.store = cache.NewStore(cache.MetaNamespaceKeyFunc)
			ctx := context.Background()
			if err := c.start(ctx, tf); err != nil {
				t.Fatal(err)
			}
			got, err := ops.OpsV1alpha1().Traceflows().Get(ctx, "tf", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st := got.Status
			if tc.field == "" {
				if st.Phase != opsv1alpha1.TraceflowRunning {
					t.Fatalf("phase %q (%s), want Running", st.Phase, st.Reason)
				}
				return
			}
			if st.Phase != opsv1alpha1.TraceflowFailed {
				t.Fatalf("phase %q, want Failed", st.Phase)
			}
			if !strings.Contains(st.Reason, tc.field) || !strings.Contains(st.Reason, tc.value) {
				t.Errorf("reason %q does not name %s %s", st.Reason, tc.field, tc.value)
			}
		})
	}
}

// A Running trace of this Node fails once its object's StartTime plus its
// timeoutSeconds (DefaultTimeout when 0) has passed, even when this daemon
// did not start it (it restarted mid-trace): the deadline is read from the
// object, not only from memory.
func TestSyncFailsATraceStartedBeforeARestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		started time.Duration // before now
		secs    int32
		want    string
	}{
		{"default timeout passed", time.Minute, 0, opsv1alpha1.TraceflowFailed},
		{"timeoutSeconds passed", 5 * time.Second, 3, opsv1alpha1.TraceflowFailed},
		{"default timeout not passed", 0, 0, opsv1alpha1.TraceflowRunning},
		{"timeoutSeconds not passed", time.Minute, 3600, opsv1alpha1.TraceflowRunning},
	} {
		start := metav1.NewTime(time.Now().Add(-tc.started))
		tf := &opsv1alpha1.Traceflow{ObjectMeta: metav1.ObjectMeta{Name: "tf-a", UID: "u1"},
			Spec:   opsv1alpha1.TraceflowSpec{TimeoutSeconds: tc.secs},
			Status: opsv1alpha1.TraceflowStatus{Phase: opsv1alpha1.TraceflowRunning, SourceNode: "n1", Tag: 9, StartTime: &start}}
		ops := opsfake.NewSimpleClientset(tf.DeepCopy())
		c := New(ops, Config{NodeName: "n1", NodeIP: net.ParseIP("198.18.0.11")}, zap.NewNop())
		c.store = cache.NewStore(cache.MetaNamespaceKeyFunc)
		if err := c.store.Add(tf); err != nil {
			t.Fatal(err)
		}
		if err := c.sync(context.Background(), "tf-a"); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c.queue.ShutDown()
		got, err := ops.OpsV1alpha1().Traceflows().Get(context.Background(), "tf-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != tc.want || (tc.want == opsv1alpha1.TraceflowFailed && got.Status.Reason == "") {
			t.Errorf("%s: status %+v, want phase %s", tc.name, got.Status, tc.want)
		}
	}
}

package flows

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// ovsBridge starts a private OVS with br-int (tunnel 1, gateway 2, Pods a,
// b, c on 3, 4, 5) and installs the base pipeline, the Pod flows (with the
// isolation the policies give them) and the given policy flows. It returns a trace function: the verdict for a flow
// (ovs-ofctl syntax) under the given ct_state of the recirculated packet.
func ovsBridge(t *testing.T, src *MapSource, policies evalSet) func(flow, ct string) string {
	t.Helper()
	o := ovstest.Start(t)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
		"fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	o.Run("ovs-vsctl", "add-port", "br-int", "tun0", "--", "set", "interface", "tun0", "type=geneve",
		"options:remote_ip=flow", "options:key=flow", "ofport_request=1")
	o.Run("ovs-vsctl", "add-port", "br-int", "gw0", "--", "set", "interface", "gw0", "type=internal", "ofport_request=2")
	for _, n := range []string{"a", "b", "c"} {
		p := src.Pods["default/"+n]
		o.Run("ovs-vsctl", "add-port", "br-int", "p"+n, "--", "set", "interface", "p"+n, "type=internal",
			fmt.Sprintf("ofport_request=%d", p.OFPort))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := of.Dial(ctx, o.MgmtSocket("br-int"), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fs := pipeline.BaseFlows(testBridge)
	peer := pipeline.PeerNode{ID: 9, PodCIDR: cidr("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"), GatewayIP: net.ParseIP("10.244.2.1")}
	fs = append(fs, pipeline.PeerNodeFlows(testBridge, peer)...)
	for _, n := range []string{"a", "b", "c"} {
		p := src.Pods["default/"+n]
		iso := policies.iso[p.OFPort]
		fs = append(fs, pipeline.PodFlows(testBridge, pipeline.Pod{OFPort: p.OFPort, IP: p.IP, MAC: podMAC(p),
			IngressIsolated: iso.ingress, EgressIsolated: iso.egress})...)
	}
	fs = append(fs, policies.flows...)
	mods := make([]of.FlowMod, len(fs))
	for i, f := range fs {
		mods[i] = of.FlowMod{Op: of.OpAdd, Flow: f}
	}
	if err := c.Apply(ctx, mods); err != nil {
		t.Fatalf("installing flows: %v", err)
	}
	return func(flow, ct string) string {
		out := o.Run("ovs-appctl", "ofproto/trace", "br-int", flow, "--ct-next", ct)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "Datapath actions:") {
			t.Fatalf("trace of %s: no datapath actions:\n%s", flow, out)
		}
		if strings.HasSuffix(last, " drop") {
			return "drop"
		}
		if m := regexp.MustCompile(`output port is (\d+)`).FindStringSubmatch(out); m != nil {
			return "output:" + m[1]
		}
		if m := regexp.MustCompile(`(?m)^\s*\d+\. .*\n\s+output:(\d+)`).FindStringSubmatch(out); m != nil {
			return "output:" + m[1]
		}
		return last
	}
}

func podMAC(p Pod) net.HardwareAddr {
	ip := p.IP.To4()
	return net.HardwareAddr{0x0a, 0x58, ip[0], ip[1], ip[2], ip[3]}
}

// TestEnforcementInOVS installs policies on a real OVS and checks with
// ofproto/trace that allowed packets reach their port and denied ones are
// dropped: with conjunction IDs from one band, and with every conjunction
// in a band (a priority) of its own, where OVS must look below a priority
// whose conjunctions do not complete.
func TestEnforcementInOVS(t *testing.T) {
	for _, c := range []struct {
		name string
		ids  IDs
	}{{"one band", NewConjIDs(pipeline.ConjBandSize, pipeline.ConjBands)}, {"a band per conjunction", NewConjIDs(1, pipeline.ConjBands)}} {
		t.Run(c.name, func(t *testing.T) { enforcementInOVS(t, c.ids) })
	}
}

func enforcementInOVS(t *testing.T, ids IDs) {
	src := fixture()
	src.AppliedToGroups["g-c"] = []v1alpha1.GroupMember{src.AppliedToGroups["g-all"][2]}
	src.AppliedToGroups["g-b"] = []v1alpha1.GroupMember{src.AppliedToGroups["g-all"][1]}
	fs := translate(t, src, ids,
		// a: default deny ingress.
		policy("deny-a", "g-a", []string{"Ingress"}),
		// b: ingress from the peer group on its named port http (8080),
		// and SCTP 7777 from an ipBlock with an except.
		policy("b-in", "g-b", []string{"Ingress"},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, AddressGroups: []string{"g-peers"}, Ports: []v1alpha1.PolicyPort{named("TCP", "http")}},
			v1alpha1.Rule{Direction: v1alpha1.DirectionIn, IPBlocks: []v1alpha1.IPBlock{{CIDR: "10.244.2.0/24", Except: []string{"10.244.2.128/25"}}},
				Ports: []v1alpha1.PolicyPort{port("SCTP", 7777)}}),
		// c: egress to the peer group on TCP 80, UDP 1000-1999 and the
		// peers' named port dns; ingress denied.
		policy("c-out", "g-c", []string{"Egress", "Ingress"},
			v1alpha1.Rule{Direction: v1alpha1.DirectionOut, AddressGroups: []string{"g-peers"},
				Ports: []v1alpha1.PolicyPort{port("TCP", 80), portRange("UDP", 1000, 1999), named("UDP", "dns")}}))
	trace := ovsBridge(t, src, fs)

	const tunIn = "in_port=1,tun_id=0,tun_src=198.18.0.12,tun_dst=198.18.0.11,dl_src=0a:00:00:00:00:02,dl_dst="
	fromPeer := func(to string, srcIP string, l4 string) string {
		p := src.Pods["default/"+to]
		return fmt.Sprintf("%s%s,%s,nw_ttl=64,nw_src=%s,nw_dst=%s", tunIn, podMAC(p), l4, srcIP, p.IP)
	}
	fromPod := func(from string, dstIP string, l4 string) string {
		p := src.Pods["default/"+from]
		return fmt.Sprintf("in_port=%d,dl_src=%s,dl_dst=0a:00:00:00:00:01,%s,nw_ttl=64,nw_src=%s,nw_dst=%s", p.OFPort, podMAC(p), l4, p.IP, dstIP)
	}
	cases := []struct {
		name, flow, ct, want string
	}{
		// Default deny ingress, with the exemptions.
		{"peer to a is denied", fromPeer("a", "10.244.2.10", "tcp,tcp_dst=80"), "trk,new", "drop"},
		{"established peer to a passes", fromPeer("a", "10.244.2.10", "tcp,tcp_dst=80"), "trk,est", "output:3"},
		{"reply to a passes", fromPeer("a", "10.244.2.10", "tcp,tcp_dst=80"), "trk,est,rpl", "output:3"},
		{"kubelet (gateway IP) to a passes",
			"in_port=2,dl_src=0a:00:00:00:00:01," + fmt.Sprintf("dl_dst=%s", podMAC(src.Pods["default/a"])) + ",tcp,tcp_dst=8080,nw_ttl=64,nw_src=10.244.1.1,nw_dst=10.244.1.3",
			"trk,new", "output:3"},
		// Allow by peer IP set and named port per Pod.
		{"peer x to b http", fromPeer("b", "10.244.2.10", "tcp,tcp_dst=8080"), "trk,new", "output:4"},
		{"peer y to b http", fromPeer("b", "10.244.2.11", "tcp,tcp_dst=8080"), "trk,new", "output:4"},
		{"non-peer to b http", fromPeer("b", "10.244.2.12", "tcp,tcp_dst=8080"), "trk,new", "drop"},
		{"peer x to b other port", fromPeer("b", "10.244.2.10", "tcp,tcp_dst=9090"), "trk,new", "drop"},
		// ipBlock with except, SCTP.
		{"ipBlock to b sctp 7777", fromPeer("b", "10.244.2.77", "sctp,sctp_dst=7777"), "trk,new", "output:4"},
		{"ipBlock except to b sctp 7777", fromPeer("b", "10.244.2.200", "sctp,sctp_dst=7777"), "trk,new", "drop"},
		{"ipBlock to b tcp 7777", fromPeer("b", "10.244.2.77", "tcp,tcp_dst=7777"), "trk,new", "drop"},
		// Egress: numbered port, range, named port of the peers.
		{"c to x tcp 80", fromPod("c", "10.244.2.10", "tcp,tcp_dst=80"), "trk,new", "output:1"},
		{"c to x tcp 81", fromPod("c", "10.244.2.10", "tcp,tcp_dst=81"), "trk,new", "drop"},
		{"c to other tcp 80", fromPod("c", "10.244.2.99", "tcp,tcp_dst=80"), "trk,new", "drop"},
		{"c to y udp 1000", fromPod("c", "10.244.2.11", "udp,udp_dst=1000"), "trk,new", "output:1"},
		{"c to y udp 1999", fromPod("c", "10.244.2.11", "udp,udp_dst=1999"), "trk,new", "output:1"},
		{"c to y udp 2000", fromPod("c", "10.244.2.11", "udp,udp_dst=2000"), "trk,new", "drop"},
		{"c to x dns udp 53", fromPod("c", "10.244.2.10", "udp,udp_dst=53"), "trk,new", "output:1"},
		{"c to y udp 53 (its dns is 5353)", fromPod("c", "10.244.2.11", "udp,udp_dst=53"), "trk,new", "drop"},
		{"c to y dns udp 5353", fromPod("c", "10.244.2.11", "udp,udp_dst=5353"), "trk,new", "output:1"},
		{"established c to outside", fromPod("c", "10.244.2.99", "tcp,tcp_dst=80"), "trk,est", "output:1"},
		// Local Pod to local Pod: egress of the source, ingress of the
		// destination.
		{"b to a (a isolated)", fmt.Sprintf("in_port=4,dl_src=%s,dl_dst=%s,tcp,tcp_dst=80,nw_ttl=64,nw_src=10.244.1.4,nw_dst=10.244.1.3",
			podMAC(src.Pods["default/b"]), podMAC(src.Pods["default/a"])), "trk,new", "drop"},
		{"a to b (not from a peer)", fmt.Sprintf("in_port=3,dl_src=%s,dl_dst=%s,tcp,tcp_dst=8080,nw_ttl=64,nw_src=10.244.1.3,nw_dst=10.244.1.4",
			podMAC(src.Pods["default/a"]), podMAC(src.Pods["default/b"])), "trk,new", "drop"},
		{"a to outside (a not egress-isolated)", fromPod("a", "192.0.2.1", "udp,udp_dst=9"), "trk,new", "output:2"},
	}
	for _, c := range cases {
		if got := trace(c.flow, c.ct); got != c.want {
			t.Errorf("%s: %s (ct %s) → %s, want %s", c.name, c.flow, c.ct, got, c.want)
		}
	}
}

// TestManyRulesOnOnePortInOVS: 4,100 rules share the flow entry of their
// port (TCP 80), more conjunction actions than one OpenFlow message can
// carry (about 4,090). With the bands the entry is one flow per band, the
// switch takes them all, and a rule of each band allows its peer.
func TestManyRulesOnOnePortInOVS(t *testing.T) {
	src := fixture()
	const n = pipeline.ConjBandSize + 100
	var rules []v1alpha1.Rule
	for i := 0; i < n; i++ {
		rules = append(rules, v1alpha1.Rule{Direction: v1alpha1.DirectionIn,
			IPBlocks: []v1alpha1.IPBlock{{CIDR: fmt.Sprintf("10.244.%d.%d/32", 100+i/250, 1+i%250)}},
			Ports:    []v1alpha1.PolicyPort{port("TCP", 80)}})
	}
	fs := translate(t, src, NewConjIDs(pipeline.ConjBandSize, pipeline.ConjBands), policy("many", "g-a", []string{"Ingress"}, rules...))
	most := 0
	for _, f := range fs.flows {
		if len(f.Actions) > most {
			most = len(f.Actions)
		}
	}
	if most > pipeline.ConjBandSize {
		t.Fatalf("a flow carries %d actions", most)
	}
	trace := ovsBridge(t, src, fs)
	const tunIn = "in_port=1,tun_id=0,tun_src=198.18.0.12,tun_dst=198.18.0.11,dl_src=0a:00:00:00:00:02,dl_dst="
	a := src.Pods["default/a"]
	for _, c := range []struct {
		peer, want string
	}{
		{"10.244.100.1", "output:3"},                                          // rule 0, band 0
		{fmt.Sprintf("10.244.%d.%d", 100+(n-1)/250, 1+(n-1)%250), "output:3"}, // the last rule, band 1
		{"10.244.99.1", "drop"},                                               // no rule's peer
	} {
		flow := fmt.Sprintf("%s%s,tcp,tcp_dst=80,nw_ttl=64,nw_src=%s,nw_dst=%s", tunIn, podMAC(a), c.peer, a.IP)
		if got := trace(flow, "trk,new"); got != c.want {
			t.Errorf("%s to a on TCP 80: %s, want %s", c.peer, got, c.want)
		}
	}
}

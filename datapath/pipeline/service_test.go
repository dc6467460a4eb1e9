package pipeline_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

// OVS accepts the Service flows and groups (learn, ct with nat and mark,
// second-level groups for large endpoint sets), and a new connection to
// the VIP is DNATed to an endpoint and continues at EgressRule.
func TestServiceFlowsInOVS(t *testing.T) {
	o, c, ctx := testBridge(t, gw0, podPort("p1", 3))
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"), GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11")}
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	small := pipeline.ServicePort{ID: 7, VIPs: []net.IP{net.ParseIP("10.96.0.10")}, Protocol: 6, Port: 80,
		AffinitySeconds: 30, Endpoints: []pipeline.ServiceEndpoint{
			{IP: net.ParseIP("10.244.1.5"), Port: 8080, Local: true}, {IP: net.ParseIP("10.244.2.5"), Port: 8080}}}
	big := pipeline.ServicePort{ID: 8, VIPs: []net.IP{net.ParseIP("10.96.0.11")}, FragmentVIPs: []net.IP{net.ParseIP("10.96.0.11")},
		Protocol: 17, Port: 53}
	for i := 0; i < 2500; i++ {
		big.Endpoints = append(big.Endpoints, pipeline.ServiceEndpoint{IP: net.IPv4(10, 245, byte(i/250), byte(i%250+1)), Port: 5353})
	}
	none := pipeline.ServicePort{ID: 9, VIPs: []net.IP{net.ParseIP("10.96.0.12")}, Protocol: 6, Port: 80, Action: pipeline.ServiceReject}
	sctp := pipeline.ServicePort{ID: 10, VIPs: []net.IP{net.ParseIP("10.96.0.13")}, Protocol: 132, Port: 7777,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.6"), Port: 7777}}}
	nodePort := pipeline.ServicePort{ID: 11, VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 6, Port: 30080, External: true, SNAT: true,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}}}
	// The Node's own connections to that NodePort (externalTrafficPolicy
	// Local's short-circuit): every endpoint, matched by source first.
	fromNode := pipeline.ServicePort{ID: 12, VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 6, Port: 30080, External: true,
		Sources: []*net.IPNet{{IP: net.ParseIP("198.18.0.11"), Mask: net.CIDRMask(32, 32)}}, LocalPods: true,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}, {IP: net.ParseIP("10.244.1.5"), Port: 8080, Local: true}}}
	// An external frontend of small's Service port (a NodePort): it shares
	// small's ClientIP affinity (AffinityID), so a client keeps its
	// endpoint whichever of the port's addresses it connects to.
	stickyNodePort := pipeline.ServicePort{ID: 14, AffinityID: 7, VIPs: []net.IP{pipeline.NodePortVIP}, Protocol: 6, Port: 30081,
		External: true, SNAT: true, AffinitySeconds: 30, Endpoints: small.Endpoints}
	// A Service with two UDP ports: its VIP takes no fragments.
	syslog := pipeline.ServicePort{ID: 13, VIPs: []net.IP{net.ParseIP("10.96.0.14")}, Protocol: 17, Port: 514,
		Endpoints: []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.8"), Port: 514}}}
	flows := append(pipeline.BaseFlows(br), pipeline.PodFlows(br, p1)...)
	flows = append(flows, pipeline.ServiceBaseFlows(br)...)
	var groups []of.GroupMod
	for _, sp := range []pipeline.ServicePort{small, big, none, sctp, nodePort, fromNode, syslog, stickyNodePort} {
		fs, gs, err := pipeline.ServicePortFlows(br, sp)
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, fs...)
		for i := len(gs) - 1; i >= 0; i-- {
			groups = append(groups, of.GroupMod{Op: of.GroupOpAdd, Group: gs[i]})
		}
	}
	if len(groups) != 1+4+5 {
		t.Fatalf("%d groups, want 1 for the small service, 1+3 for 2,500 endpoints, 1 each for SCTP, the three NodePort frontends and syslog", len(groups))
	}
	for _, g := range groups { // one message per group: each must fit 64 KiB
		if err := c.ApplyGroups(ctx, []of.GroupMod{g}); err != nil {
			t.Fatalf("group %d (%d buckets): %v", g.Group.ID, len(g.Group.Buckets), err)
		}
	}
	addFlows(ctx, t, c, flows)
	dump := o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-groups", o.MgmtSocket("br-int"))
	if n := strings.Count(dump, "bucket="); n != 2+2500+3+2+2+1+2 {
		t.Errorf("%d buckets installed, want %d", n, 2+2500+3+2+2+1+2)
	}
	trace := func(flow string, ct ...string) string {
		args := []string{"ofproto/trace", "br-int", flow}
		for _, s := range ct {
			args = append(args, "--ct-next", s)
		}
		return o.Run("ovs-appctl", args...)
	}
	syn := "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,tcp,nw_ttl=64,nw_src=10.244.1.5,tp_src=40000,"
	// The select group hashes in the datapath (dp_hash, a recirculation
	// the trace cannot follow): trace the group's choice and, with the
	// endpoint register preset as a bucket leaves it, the DNAT.
	out := trace(syn+"nw_dst=10.96.0.10,tp_dst=80", "trk,new")
	if !strings.Contains(out, "group:7") {
		t.Errorf("new connection to the VIP does not reach its group:\n%s", out)
	}
	out = trace("reg6=0x0af40205,"+syn+"nw_dst=10.96.0.10,tp_dst=80", "trk,new", "trk,new")
	for _, want := range []string{"learn(table=41", "nat(dst=10.244.2.5:8080)", "Resuming from table 50"} {
		if !strings.Contains(out, want) {
			t.Errorf("new connection to the VIP: no %q in trace:\n%s", want, out)
		}
	}
	// ClientIP affinity is the Service port's, not the address's: both
	// frontends look the client up, and learn it, under AffinityKey 7 (the
	// learned flow matches the client and the key, not the VIP and port),
	// with the cookie of port 7, and an endpoint learned through one is
	// the one the other DNATs to.
	sticky := "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=198.19.0.10,tp_src=40000,nw_dst=169.254.100.2,tp_dst=30081"
	learned := fmt.Sprintf("learn(table=41,hard_timeout=30,priority=%d,cookie=0x1050000000007,eth_type=0x800,NXM_OF_IP_SRC[],reg12=0x7,load:NXM_NX_REG6[]->NXM_NX_REG6[])", pipeline.PrioNormal)
	for name, flow := range map[string]string{"ClusterIP": syn + "nw_dst=10.96.0.10,tp_dst=80", "NodePort": sticky} {
		if out := trace(flow, "trk,new"); !strings.Contains(out, "load:0x7->NXM_NX_REG12[]") || !strings.Contains(out, "resubmit(,41)") {
			t.Errorf("%s: the affinity is not looked up under key 7:\n%s", name, out)
		}
		if out := trace("reg6=0x0af40205,"+flow, "trk,new", "trk,new"); !strings.Contains(out, learned) {
			t.Errorf("%s: no %q in trace:\n%s", name, learned, out)
		}
	}
	addFlows(ctx, t, c, []of.Flow{{Table: uint8(pipeline.SessionAffinity), Priority: pipeline.PrioNormal,
		Cookie: pipeline.Cookie(br.Round, pipeline.CategoryService, 7),
		Match: of.Match{EthType: pipeline.EthTypeIPv4, IPSrc: &net.IPNet{IP: net.ParseIP("198.19.0.10").To4(), Mask: net.CIDRMask(32, 32)},
			Regs: []of.RegMatch{pipeline.AffinityKey.Match(7)}},
		Actions: []of.Action{pipeline.EndpointIP.Load(0x0af40205)}}})
	if out := trace(sticky, "trk,new", "trk,new"); !strings.Contains(out, "nat(dst=10.244.2.5:8080)") {
		t.Errorf("the NodePort does not take the endpoint its Service port learned for the client:\n%s", out)
	}
	out = trace(syn+"nw_dst=10.96.0.12,tp_dst=80", "trk,new")
	if !strings.Contains(out, "ct(commit,zone=65520)") || !strings.HasSuffix(strings.TrimSpace(out), "2") {
		t.Errorf("no-endpoint service: want commit and output to the gateway:\n%s", out)
	}
	// SCTP: the VIP's group, then the DNAT.
	sctpNew := "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,sctp,nw_ttl=64,nw_src=10.244.1.5,sctp_src=40000,nw_dst=10.96.0.13,sctp_dst=7777"
	if out := trace(sctpNew, "trk,new"); !strings.Contains(out, "group:10") {
		t.Errorf("SCTP connection to the VIP does not reach its group:\n%s", out)
	}
	if out := trace("reg6=0x0af40206,"+sctpNew, "trk,new", "trk,new"); !strings.Contains(out, "nat(dst=10.244.2.6:7777)") {
		t.Errorf("SCTP connection: no DNAT in trace:\n%s", out)
	}
	// A UDP datagram in fragments: their ports read 0, and the VIP of a
	// Service with one UDP port takes them to its group. A UDP VIP without
	// FragmentVIPs takes its whole datagrams, not fragments.
	frag := "in_port=3,dl_src=0a:00:00:00:01:05,dl_dst=0a:00:00:00:00:01,udp,nw_ttl=64,nw_src=10.244.1.5,"
	for _, f := range []string{"nw_frag=first", "nw_frag=later"} {
		if out := trace(frag+"nw_dst=10.96.0.11,"+f, "trk,new"); !strings.Contains(out, "group:8") {
			t.Errorf("UDP fragment (%s) to the VIP does not reach its group:\n%s", f, out)
		}
		if out := trace(frag+"nw_dst=10.96.0.14,"+f, "trk,new"); strings.Contains(out, "group:13") {
			t.Errorf("UDP fragment (%s) to a VIP without fragment frontend reached its group:\n%s", f, out)
		}
	}
	if out := trace(frag+"nw_dst=10.96.0.14,udp_src=40000,udp_dst=514", "trk,new"); !strings.Contains(out, "group:13") {
		t.Errorf("whole UDP datagram to the two-port Service does not reach its group:\n%s", out)
	}
	// NodePort: only from the gateway, DNAT with the external and SNAT
	// marks; a Pod sending to the NodePort VIP does not match it.
	npNew := "dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=198.19.0.10,tp_src=40000,nw_dst=169.254.100.2,tp_dst=30080"
	if out := trace("in_port=2,"+npNew, "trk,new"); !strings.Contains(out, "group:11") {
		t.Errorf("NodePort from the gateway does not reach its group:\n%s", out)
	}
	out = trace("in_port=2,reg6=0x0af40207,"+npNew, "trk,new", "trk,new")
	for _, want := range []string{"nat(dst=10.244.2.7:8080)", "exec(load:0x6->NXM_NX_CT_MARK[0..2])"} {
		if !strings.Contains(out, want) {
			t.Errorf("NodePort connection: no %q in trace:\n%s", want, out)
		}
	}
	if out := trace("in_port=3,"+strings.Replace(npNew, "nw_src=198.19.0.10", "nw_src=10.244.1.5", 1), "trk,new"); strings.Contains(out, "group:11") {
		t.Errorf("a Pod's packet matched the NodePort frontend:\n%s", out)
	}
	if out := trace("in_port=2,"+strings.Replace(npNew, "nw_src=198.19.0.10", "nw_src=198.18.0.11", 1), "trk,new"); !strings.Contains(out, "group:12") {
		t.Errorf("the Node's own connection to the NodePort does not reach the frontend of its own:\n%s", out)
	}
	// A local Pod's connection to its Node's NodePort comes back from the
	// host (the podCIDR from the gateway): the Node's frontend too.
	if out := trace("in_port=2,"+strings.Replace(npNew, "nw_src=198.19.0.10", "nw_src=10.244.1.77", 1), "trk,new"); !strings.Contains(out, "group:12") ||
		!strings.Contains(out, "load:0x1->NXM_NX_REG0[22]") {
		t.Errorf("a local Pod's connection handed back by the host does not reach the Node's own frontend:\n%s", out)
	}
	// Non-Service traffic is untouched by the Service tables.
	out = trace(syn+"nw_dst=198.19.0.10,tp_dst=80", "trk,new")
	if strings.Contains(out, "nat(dst") || !strings.Contains(out, fmt.Sprintf("goto_table:%d", pipeline.EgressRule)) {
		t.Errorf("plain traffic:\n%s", out)
	}
}

// A LoadBalancer IP with loadBalancerSourceRanges, as the proxy gives it
// two frontends (for Pods, and external from the gateway): a new
// connection from an admitted range reaches its frontend's group, from a
// Pod as from the gateway; one from elsewhere is dropped, the one from the
// gateway without falling through to the Pods' frontend below it.
func TestServiceSourceRanges(t *testing.T) {
	o, c, ctx := testBridge(t, gw0, podPort("p1", 3), podPort("p2", 4))
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"), GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11")}
	p1 := pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	p2 := pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06")}
	lbIP := []net.IP{net.ParseIP("198.18.100.2")}
	eps := []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.2.7"), Port: 8080}}
	// 198.19.6.0/24 is admitted from Pods' side only: a gateway packet
	// from there must not fall through to the Pods' frontend.
	ranges := []*net.IPNet{mustCIDR("10.244.1.5/32"), mustCIDR("198.19.5.0/24")}
	podRanges := append([]*net.IPNet{mustCIDR("198.19.6.0/24")}, ranges...)
	pods := pipeline.ServicePort{ID: 21, VIPs: lbIP, Protocol: 6, Port: 80, Endpoints: eps, SourceRanges: podRanges}
	outside := pipeline.ServicePort{ID: 22, VIPs: lbIP, Protocol: 6, Port: 80, Endpoints: eps, External: true, SNAT: true,
		SourceRanges: ranges}
	flows := append(pipeline.BaseFlows(br), pipeline.PodFlows(br, p1)...)
	flows = append(flows, pipeline.PodFlows(br, p2)...)
	flows = append(flows, pipeline.ServiceBaseFlows(br)...)
	var groups []of.GroupMod
	for _, sp := range []pipeline.ServicePort{pods, outside} {
		fs, gs, err := pipeline.ServicePortFlows(br, sp)
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, fs...)
		for _, g := range gs {
			groups = append(groups, of.GroupMod{Op: of.GroupOpAdd, Group: g})
		}
	}
	if err := c.ApplyGroups(ctx, groups); err != nil {
		t.Fatal(err)
	}
	addFlows(ctx, t, c, flows)
	trace := func(flow string) string {
		return o.Run("ovs-appctl", "ofproto/trace", "br-int", flow, "--ct-next", "trk,new")
	}
	fromPod := func(port int, mac, ip string) string {
		return fmt.Sprintf("in_port=%d,dl_src=%s,dl_dst=0a:00:00:00:00:01,tcp,nw_ttl=64,nw_src=%s,tp_src=40000,nw_dst=198.18.100.2,tp_dst=80", port, mac, ip)
	}
	fromGateway := func(src string) string {
		return "in_port=2,dl_src=0a:00:00:00:00:01,dl_dst=0e:5e:1e:00:00:01,tcp,nw_ttl=64,nw_src=" + src + ",tp_src=40000,nw_dst=198.18.100.2,tp_dst=80"
	}
	for _, tc := range []struct {
		what, flow, group string // group "" : dropped
	}{
		{"a Pod in the ranges", fromPod(3, "0a:00:00:00:01:05", "10.244.1.5"), "group:21"},
		{"a Pod outside them", fromPod(4, "0a:00:00:00:01:06", "10.244.1.6"), ""},
		{"a client in the ranges, from the gateway", fromGateway("198.19.5.7"), "group:22"},
		{"a client outside them, from the gateway", fromGateway("198.19.6.7"), ""},
	} {
		out := trace(tc.flow)
		switch {
		case tc.group != "" && !strings.Contains(out, tc.group):
			t.Errorf("%s: does not reach %s:\n%s", tc.what, tc.group, out)
		case tc.group == "" && (strings.Contains(out, "group:") || !strings.Contains(out, "Datapath actions: drop")):
			t.Errorf("%s: not dropped:\n%s", tc.what, out)
		}
	}
}

// Every ServiceLB flow that names a VIP and port tells its frontend's kind
// by its priority (FrontendKindOf), whatever the frontend's action and
// source limits: the proxy reads IDs back from them after a restart.
func TestFrontendKindOfServiceLBFlows(t *testing.T) {
	br := pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01")}
	eps := []pipeline.ServiceEndpoint{{IP: net.ParseIP("10.244.1.5"), Port: 8080}}
	ranges := []*net.IPNet{mustCIDR("198.18.0.0/16")}
	sources := []*net.IPNet{mustCIDR("198.18.0.11/32")}
	var ports []pipeline.ServicePort
	for _, action := range []pipeline.ServiceAction{pipeline.ServiceBalance, pipeline.ServiceReject, pipeline.ServiceDrop} {
		for _, ext := range []bool{false, true} {
			for _, limit := range []string{"", "ranges", "sources", "pods", "sources+pods"} {
				sp := pipeline.ServicePort{ID: uint32(len(ports) + 1), VIPs: []net.IP{net.ParseIP("198.18.100.2")}, Protocol: 17, Port: 53,
					FragmentVIPs: []net.IP{net.ParseIP("198.18.100.2")}, Action: action, External: ext}
				if action == pipeline.ServiceBalance {
					sp.Endpoints = eps
				}
				switch limit {
				case "ranges":
					sp.SourceRanges = ranges
				case "sources":
					sp.Sources = sources
				case "pods":
					sp.LocalPods = ext // LocalPods is External only
				case "sources+pods":
					sp.Sources, sp.LocalPods = sources, ext
				}
				ports = append(ports, sp)
			}
		}
	}
	for _, sp := range ports {
		fs, _, err := pipeline.ServicePortFlows(br, sp)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range fs {
			if f.Table != uint8(pipeline.ServiceLB) || f.Match.L4Dst == nil {
				continue
			}
			n++
			if got := pipeline.FrontendKindOf(f.Priority); got != sp.Kind() {
				t.Errorf("%+v: flow at priority %d reads as kind %d, want %d", sp, f.Priority, got, sp.Kind())
			}
		}
		if n == 0 {
			t.Errorf("%+v: no ServiceLB flow with a port", sp)
		}
	}
}

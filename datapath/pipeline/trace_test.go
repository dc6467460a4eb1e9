package pipeline_test

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/datapath/packet"
	"github.com/seine-net/seine/datapath/pipeline"
)

// Every table has one trace observation bit.
func TestTraceVisitedFitsEveryTable(t *testing.T) {
	if n := len(pipeline.Tables()); n > int(pipeline.TraceVisited.NBits()) {
		t.Fatalf("%d tables, TraceVisited has %d bits", n, pipeline.TraceVisited.NBits())
	}
	if tb, ok := pipeline.TableByName("ingressdefault"); !ok || tb != pipeline.IngressDefault {
		t.Fatalf("TableByName(ingressdefault) = %v, %v", tb, ok)
	}
}

// traceBridge is a bridge with the pipeline, two Pods, a peer and the
// trace flows, and a packet-in collector.
type traceBridge struct {
	c    *of.Client
	ins  chan of.PacketIn
	br   pipeline.Bridge
	p1   pipeline.Pod
	p2   pipeline.Pod
	omgr *ovstest.OVS
}

// egress picks the tunnel egress; TunnelSegmented adds the segmentation
// ports (ofports 5 and 6).
func newTraceBridge(t *testing.T, isolateP2 bool, egress ...pipeline.TunnelEgress) *traceBridge {
	var eg pipeline.TunnelEgress
	if len(egress) > 0 {
		eg = egress[0]
	}
	seg := eg == pipeline.TunnelSegmented
	ports := []testPort{geneveTun0, gw0, podPort("p1", 3), podPort("p2", 4)}
	if seg {
		ports = append(ports, seg0)
	}
	o, c, ctx := testBridge(t, ports...)
	tb := &traceBridge{c: c, ins: make(chan of.PacketIn, 64), omgr: o}
	c.SubscribePacketIns(func(pi of.PacketIn) { tb.ins <- pi })
	tb.br = pipeline.Bridge{Round: 1, GatewayPort: 2, GatewayMAC: mustMAC("0a:00:00:00:00:01"), GatewayIP: net.ParseIP("10.244.1.1"),
		PodCIDR: mustCIDR("10.244.1.0/24"), NodeIP: net.ParseIP("198.18.0.11"), TunnelPort: 1}
	tb.br.Tunnel = eg
	if seg {
		tb.br.SegmentPort = 5
	}
	tb.p1 = pipeline.Pod{OFPort: 3, IP: net.ParseIP("10.244.1.5"), MAC: mustMAC("0a:00:00:00:01:05")}
	tb.p2 = pipeline.Pod{OFPort: 4, IP: net.ParseIP("10.244.1.6"), MAC: mustMAC("0a:00:00:00:01:06"), IngressIsolated: isolateP2}
	peer := pipeline.PeerNode{ID: 9, PodCIDR: mustCIDR("10.244.2.0/24"), NodeIP: net.ParseIP("198.18.0.12"), GatewayIP: net.ParseIP("10.244.2.1")}
	var flows []of.Flow
	flows = append(flows, pipeline.BaseFlows(tb.br)...)
	flows = append(flows, pipeline.PolicyBaseFlows(tb.br)...)
	flows = append(flows, pipeline.TraceFlows(tb.br)...)
	flows = append(flows, pipeline.PodFlows(tb.br, tb.p1)...)
	flows = append(flows, pipeline.PodFlows(tb.br, tb.p2)...)
	flows = append(flows, pipeline.PeerNodeFlows(tb.br, peer)...)
	addFlows(ctx, t, c, flows)
	return tb
}

// collect returns the packet-ins that arrive until none came for 300 ms.
func (tb *traceBridge) collect(t *testing.T) []of.PacketIn {
	var out []of.PacketIn
	deadline := time.After(5 * time.Second)
	for {
		select {
		case pi := <-tb.ins:
			out = append(out, pi)
		case <-time.After(300 * time.Millisecond):
			return out
		case <-deadline:
			t.Fatal("packet-ins kept coming")
		}
	}
}

func tableNames(pis []of.PacketIn) []string {
	var out []string
	for _, pi := range pis {
		out = append(out, pipeline.Table(pi.Table).String())
	}
	return out
}

func regValue(m of.Match, f pipeline.RegField) uint32 {
	for _, r := range m.Regs {
		if r.Reg == f.Reg() {
			return (r.Value & f.Mask()) >> f.Ofs()
		}
	}
	return 0
}

func (tb *traceBridge) inject(t *testing.T, tag uint16, dst net.IP, dstMAC net.HardwareAddr) {
	t.Helper()
	frame, err := packet.Build(packet.Probe{SrcMAC: tb.p1.MAC, DstMAC: dstMAC, SrcIP: tb.p1.IP, DstIP: dst,
		Protocol: packet.ProtoTCP, SrcPort: 40000 + tag, DstPort: 80, ID: tag})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.c.PacketOut(ctx, tb.p1.OFPort, pipeline.TraceInjectActions(tag), frame); err != nil {
		t.Fatal(err)
	}
}

// A marked packet reports every table it passes, once, in order, with its
// tag; its last report says where it went.
func TestTraceFlowsObserveEveryTable(t *testing.T) {
	tb := newTraceBridge(t, false)
	tb.inject(t, 7, tb.p2.IP, tb.br.GatewayMAC)
	pis := tb.collect(t)
	want := []string{"Classifier", "SpoofGuard", "NATLookup", "SaveHeaders", "Conntrack", "ConntrackState", "ServiceLB", "SessionAffinity", "EndpointDNAT",
		"EgressRule", "EgressDefault", "L3Forwarding", "L2Forwarding", "IngressRule", "IngressDefault", "ConntrackCommit", "Output"}
	if got := tableNames(pis); !slices.Equal(got, want) {
		t.Fatalf("tables reported:\n got %v\nwant %v", got, want)
	}
	last := pis[len(pis)-1]
	if regValue(last.Metadata, pipeline.TraceTag) != 7 || regValue(last.Metadata, pipeline.OutputResolved) != 1 ||
		regValue(last.Metadata, pipeline.TargetOFPort) != tb.p2.OFPort {
		t.Fatalf("last report %s: want tag 7 and output to port %d", last.Metadata, tb.p2.OFPort)
	}

	// Towards a peer: the packet leaves through the tunnel, with the
	// tag in the tunnel key.
	tb.inject(t, 8, net.ParseIP("10.244.2.7"), tb.br.GatewayMAC)
	pis = tb.collect(t)
	last = pis[len(pis)-1]
	if pipeline.Table(last.Table) != pipeline.Output || regValue(last.Metadata, pipeline.TargetOFPort) != tb.br.TunnelPort ||
		last.Metadata.TunDst == nil || !last.Metadata.TunDst.Equal(net.ParseIP("198.18.0.12")) {
		t.Fatalf("last report table %s metadata %s: want Output to the tunnel, tun_dst 198.18.0.12", pipeline.Table(last.Table), last.Metadata)
	}
	dump := tb.omgr.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", tb.omgr.MgmtSocket("br-int"), "table=120")
	if !strings.Contains(dump, "n_packets=1,") || !strings.Contains(dump, "move:NXM_NX_REG3[0..15]->NXM_NX_TUN_ID[0..15]") {
		t.Fatalf("the tunnel marker flow did not send the packet:\n%s", dump)
	}

	// A marked packet arriving from the tunnel: reported from Classifier
	// on, with the tag taken from the key.
	frame, err := packet.Build(packet.Probe{SrcMAC: mustMAC("0a:00:00:00:00:02"), DstMAC: pipeline.VirtualMAC(),
		SrcIP: net.ParseIP("10.244.2.7"), DstIP: tb.p1.IP, Protocol: packet.ProtoICMP, ID: 3, TTL: 63})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = tb.c.PacketOut(ctx, tb.br.TunnelPort, []of.Action{
		of.SetTunID{ID: pipeline.TunnelKeyTraced | 0x42}, of.Resubmit{Table: uint8(pipeline.Classifier)}}, frame)
	if err != nil {
		t.Fatal(err)
	}
	pis = tb.collect(t)
	if len(pis) == 0 || pipeline.Table(pis[0].Table) != pipeline.Classifier || regValue(pis[0].Metadata, pipeline.TraceTag) != 0x42 {
		t.Fatalf("reports of a traced tunnel packet: %v (first %+v)", tableNames(pis), pis)
	}
	last = pis[len(pis)-1]
	if pipeline.Table(last.Table) != pipeline.Output || regValue(last.Metadata, pipeline.TargetOFPort) != tb.p1.OFPort {
		t.Fatalf("a traced tunnel packet ended in %s (%s), want Output to port %d", pipeline.Table(last.Table), last.Metadata, tb.p1.OFPort)
	}

	// An unmarked tunnel packet reports nothing: a marked one sent after
	// it (ovs-vswitchd handles one connection's packet-outs in order) is
	// the only one reported, up to its Output.
	err = tb.c.PacketOut(ctx, tb.br.TunnelPort, []of.Action{of.Resubmit{Table: uint8(pipeline.Classifier)}}, frame)
	if err != nil {
		t.Fatal(err)
	}
	err = tb.c.PacketOut(ctx, tb.br.TunnelPort, []of.Action{
		of.SetTunID{ID: pipeline.TunnelKeyTraced | 0x43}, of.Resubmit{Table: uint8(pipeline.Classifier)}}, frame)
	if err != nil {
		t.Fatal(err)
	}
	for _, pi := range tb.collectThroughOutput(t) {
		if tag := regValue(pi.Metadata, pipeline.TraceTag); tag != 0x43 {
			t.Fatalf("a packet with tag %#x was reported by %s; only the marked one (0x43) may be", tag, pipeline.Table(pi.Table))
		}
	}
}

// collectThroughOutput returns the packet-ins that arrive up to and
// including the first one from the Output table.
func (tb *traceBridge) collectThroughOutput(t *testing.T) []of.PacketIn {
	t.Helper()
	var out []of.PacketIn
	deadline := time.After(5 * time.Second)
	for {
		select {
		case pi := <-tb.ins:
			out = append(out, pi)
			if pipeline.Table(pi.Table) == pipeline.Output {
				return out
			}
		case <-deadline:
			t.Fatalf("no report from Output within 5 s; got %v", tableNames(out))
		}
	}
}

// With segmented tunnel egress (userspace TSO), a traced packet for a peer
// skips the segmentation detour, which would lose its registers: it
// leaves through the tunnel with its tag, while an unmarked one takes the
// detour.
func TestTraceFlowsSkipTheSegmentationDetour(t *testing.T) {
	tb := newTraceBridge(t, false, pipeline.TunnelSegmented)
	tb.inject(t, 11, net.ParseIP("10.244.2.7"), tb.br.GatewayMAC)
	pis := tb.collect(t)
	if len(pis) == 0 {
		t.Fatal("no reports")
	}
	last := pis[len(pis)-1]
	if pipeline.Table(last.Table) != pipeline.Output || regValue(last.Metadata, pipeline.TargetOFPort) != tb.br.TunnelPort ||
		last.Metadata.TunDst == nil || !last.Metadata.TunDst.Equal(net.ParseIP("198.18.0.12")) {
		t.Fatalf("last report table %s metadata %s: want Output to the tunnel, tun_dst 198.18.0.12", pipeline.Table(last.Table), last.Metadata)
	}
	frame, err := packet.Build(packet.Probe{SrcMAC: tb.p1.MAC, DstMAC: tb.br.GatewayMAC, SrcIP: tb.p1.IP,
		DstIP: net.ParseIP("10.244.2.7"), Protocol: packet.ProtoTCP, SrcPort: 40100, DstPort: 80, ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.c.PacketOut(ctx, tb.p1.OFPort, []of.Action{of.Resubmit{Table: uint8(pipeline.Classifier)}}, frame); err != nil {
		t.Fatal(err)
	}
	// The unmarked packet's output is the L2Forwarding peer flow that
	// targets seine-seg0.
	dump := tb.omgr.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", tb.omgr.MgmtSocket("br-int"), "table=80")
	var toSeg, traced bool
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "n_packets=1,") && strings.Contains(l, "load:0x5->NXM_NX_REG1[]") {
			toSeg = true
		}
		if strings.Contains(l, "n_packets=1,") && strings.Contains(l, "load:0x1->NXM_NX_REG1[]") && strings.Contains(l, "reg3=0x10000/0x10000") {
			traced = true
		}
	}
	if !toSeg || !traced {
		t.Fatalf("want one packet through the segmentation port's flow and one through the traced packets' flow:\n%s", dump)
	}
}

// Through a kernel tunnel device (TunnelByMAC) the tag travels in the
// inner source MAC: a traced packet leaves with TraceMAC|tag, and one
// arriving with it is traced from the peer's Classifier on.
func TestTraceFlowsThroughAKernelTunnel(t *testing.T) {
	tb := newTraceBridge(t, false, pipeline.TunnelByMAC)
	tb.inject(t, 12, net.ParseIP("10.244.2.7"), tb.br.GatewayMAC)
	pis := tb.collect(t)
	if len(pis) == 0 {
		t.Fatal("no reports")
	}
	last := pis[len(pis)-1]
	if pipeline.Table(last.Table) != pipeline.Output || regValue(last.Metadata, pipeline.TargetOFPort) != tb.br.TunnelPort {
		t.Fatalf("last report table %s metadata %s: want Output to the tunnel", pipeline.Table(last.Table), last.Metadata)
	}
	dump := tb.omgr.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", tb.omgr.MgmtSocket("br-int"), "table=120")
	if !strings.Contains(dump, "n_packets=1,") || !strings.Contains(dump, "move:NXM_NX_REG3[0..15]->NXM_OF_ETH_SRC[0..15]") {
		t.Fatalf("the tunnel marker flow did not send the packet:\n%s", dump)
	}
	frame, err := packet.Build(packet.Probe{SrcMAC: net.HardwareAddr{0x0e, 0x5e, 0x7a, 0xce, 0, 0x42}, DstMAC: pipeline.PeerMAC(tb.br.NodeIP),
		SrcIP: net.ParseIP("10.244.2.7"), DstIP: tb.p1.IP, Protocol: packet.ProtoICMP, ID: 3, TTL: 63})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.c.PacketOut(ctx, tb.br.TunnelPort, []of.Action{of.Resubmit{Table: uint8(pipeline.Classifier)}}, frame); err != nil {
		t.Fatal(err)
	}
	pis = tb.collect(t)
	if len(pis) == 0 || pipeline.Table(pis[0].Table) != pipeline.Classifier || regValue(pis[0].Metadata, pipeline.TraceTag) != 0x42 {
		t.Fatalf("reports of a traced tunnel packet: %v", tableNames(pis))
	}
	if last := pis[len(pis)-1]; regValue(last.Metadata, pipeline.TargetOFPort) != tb.p1.OFPort {
		t.Fatalf("a traced tunnel packet ended in %s (%s), want output to port %d", pipeline.Table(last.Table), last.Metadata, tb.p1.OFPort)
	}
}

// A packet the default deny drops ends its reports in IngressDefault.
func TestTraceFlowsShowTheDrop(t *testing.T) {
	tb := newTraceBridge(t, true)
	tb.inject(t, 9, tb.p2.IP, tb.br.GatewayMAC)
	pis := tb.collect(t)
	if len(pis) == 0 || pipeline.Table(pis[len(pis)-1].Table) != pipeline.IngressDefault {
		t.Fatalf("reports %v: want the last in IngressDefault", tableNames(pis))
	}
}

// docs/design.md holds the tables and registers as the code declares them
// (regenerate with `go generate ./datapath/pipeline`), and every table and
// register is documented; no two register fields overlap.
func TestDesignDocIsGenerated(t *testing.T) {
	b, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), pipeline.MarkdownTables()) {
		t.Fatal("docs/design.md's pipeline tables differ from the code: run go generate ./datapath/pipeline")
	}
	for _, line := range strings.Split(pipeline.MarkdownTables(), "\n") {
		if strings.HasSuffix(line, "|  | drop |") || strings.HasSuffix(line, "|  | next |") {
			t.Errorf("undocumented table: %s", line)
		}
	}
	regs := pipeline.Registers()
	for i, a := range regs {
		for _, c := range regs[i+1:] {
			if a.Field.Reg() == c.Field.Reg() && a.Field.Mask()&c.Field.Mask() != 0 {
				t.Errorf("%s (%s) overlaps %s (%s)", a.Name, a.Field, c.Name, c.Field)
			}
		}
	}
}

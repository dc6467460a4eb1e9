package inspect

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	"github.com/seine-net/seine/node/localapi"
)

var (
	finalFlowLine = regexp.MustCompile(`(?m)^Final flow: (.*)$`)
	reg1Field     = regexp.MustCompile(`\breg1=0x([0-9a-f]+)`)
	tunDstField   = regexp.MustCompile(`\btun_dst=([0-9.]+)`)
	dlDstField    = regexp.MustCompile(`\bdl_dst=([0-9a-f:]{17})`)
)

// protoKeywords are the ovs-ofctl(8) shorthands that set the protocol.
var protoKeywords = map[string]bool{"ip": true, "icmp": true, "tcp": true, "udp": true, "sctp": true}

// TracePacket traces, with ofproto/trace, a packet a local Pod sends to a
// Pod or an address, and says what this Node's pipeline does with it.
func (in *Inspector) TracePacket(ctx context.Context, req localapi.TraceRequest) (localapi.TraceResult, error) {
	ns, name, ok := strings.Cut(req.Source, "/")
	if !ok {
		return localapi.TraceResult{}, localapi.BadRequest("source %q: want namespace/name", req.Source)
	}
	src, found := in.d.Pods.Attachment(ns, name)
	if !found {
		return localapi.TraceResult{}, localapi.NotFound("pod %s is not attached to Node %s: run seinectl on its Node", req.Source, in.d.Config.NodeName)
	}
	dstIP := net.ParseIP(req.Destination).To4()
	dstMAC := in.d.Bridge.GatewayMAC.String()
	if dstIP == nil {
		dns, dname, ok := strings.Cut(req.Destination, "/")
		if !ok {
			return localapi.TraceResult{}, localapi.BadRequest("destination %q: want namespace/name or an IPv4 address", req.Destination)
		}
		if a, local := in.d.Pods.Attachment(dns, dname); local {
			dstIP, dstMAC = net.ParseIP(a.IP).To4(), a.MAC
		} else {
			ip, err := in.d.PodIP(ctx, dns, dname)
			if err != nil {
				return localapi.TraceResult{}, localapi.NotFound("destination pod %s: %v", req.Destination, err)
			}
			if dstIP = net.ParseIP(ip).To4(); dstIP == nil {
				return localapi.TraceResult{}, localapi.BadRequest("destination pod %s has no IPv4 address yet", req.Destination)
			}
		}
	}
	extra := strings.Trim(req.Flow, ", ")
	proto := "icmp"
	fields := []string{}
	for _, f := range strings.Split(extra, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case protoKeywords[f]:
			proto = f
		default:
			fields = append(fields, f)
		}
	}
	if proto == "icmp" && !strings.Contains(extra, "icmp_type") {
		fields = append(fields, "icmp_type=8")
	}
	flow := fmt.Sprintf("in_port=%d,%s,dl_src=%s,dl_dst=%s,nw_src=%s,nw_dst=%s,nw_ttl=64", src.OFPort, proto, src.MAC, dstMAC, src.IP, dstIP)
	if len(fields) > 0 {
		flow += "," + strings.Join(fields, ",")
	}
	out, err := in.d.Appctl.TraceFlow(ctx, in.d.Config.BridgeName, flow)
	if err != nil {
		return localapi.TraceResult{}, localapi.BadRequest("ofproto/trace %s: %v", flow, err)
	}
	tr, err := ovsctl.ParseTrace(out)
	if err != nil {
		return localapi.TraceResult{}, fmt.Errorf("reading the trace of %s: %w", flow, err)
	}
	res := localapi.TraceResult{Node: in.d.Config.NodeName, Flow: flow, DatapathActions: tr.DatapathActions, Output: out}
	for _, t := range tr.Tables {
		res.Tables = append(res.Tables, tableName(t))
	}
	var last pipeline.Table
	if len(tr.Tables) > 0 {
		last = pipeline.Table(tr.Tables[len(tr.Tables)-1])
	}
	finals := finalFlowLine.FindAllStringSubmatch(out, -1)
	final := ""
	if len(finals) > 0 {
		final = finals[len(finals)-1][1]
	}
	res.Verdict, res.Detail = in.verdict(tr.Output, last, final)
	return res, nil
}

// verdict says where a traced packet went from the last table it visited
// and the registers of the trace's final flow.
func (in *Inspector) verdict(output bool, last pipeline.Table, final string) (string, string) {
	if !output {
		if last == pipeline.ServiceLB {
			return opsv1alpha1.TraceToHost, pipeline.DropReason(last)
		}
		return opsv1alpha1.TraceDropped, fmt.Sprintf("in %s: %s", last, pipeline.DropReason(last))
	}
	port := uint32(0)
	if m := reg1Field.FindStringSubmatch(final); m != nil {
		if v, err := strconv.ParseUint(m[1], 16, 32); err == nil {
			port = uint32(v)
		}
	}
	var tunDst net.IP
	if m := tunDstField.FindStringSubmatch(final); m != nil {
		tunDst = net.ParseIP(m[1])
	}
	var dstMAC net.HardwareAddr
	if m := dlDstField.FindStringSubmatch(final); m != nil {
		dstMAC, _ = net.ParseMAC(m[1])
	}
	return in.DescribeOutput(last, port, tunDst, dstMAC)
}

// DescribeOutput names where a packet output from table last to port (the
// TargetOFPort register; tunDst the tunnel destination, if any; dstMAC its
// destination MAC) went: the ops.seine.io outcome (Delivered, Forwarded,
// ToHost) and a detail naming the Pod or the next Node. A packet for the
// tunnel without tun_dst (a kernel VXLAN device, or the segmentation port
// on its way to the tunnel) names its peer by its destination MAC
// (pipeline.PeerMAC).
func (in *Inspector) DescribeOutput(last pipeline.Table, port uint32, tunDst net.IP, dstMAC net.HardwareAddr) (string, string) {
	b := in.d.Bridge
	toTunnel := b.TunnelPort != 0 && (port == b.TunnelPort || (b.Tunnel == pipeline.TunnelSegmented && port == b.SegmentPort))
	if toTunnel && tunDst == nil {
		tunDst = pipeline.PeerNodeIP(dstMAC)
	}
	switch {
	case last != pipeline.Output:
		return opsv1alpha1.TraceToHost, fmt.Sprintf("output by table %s", last)
	case toTunnel:
		node := ""
		if in.d.NodeByIP != nil && tunDst != nil {
			node = in.d.NodeByIP(tunDst)
		}
		if node == "" {
			node = fmt.Sprint(tunDst)
		}
		return opsv1alpha1.TraceForwarded, fmt.Sprintf("through the tunnel to Node %s (%s)", node, tunDst)
	case port == b.GatewayPort:
		return opsv1alpha1.TraceToHost, "to the host through the gateway " + in.d.Config.GatewayName
	}
	for _, a := range in.d.Pods.Attachments() {
		if a.OFPort == port {
			return opsv1alpha1.TraceDelivered, fmt.Sprintf("to Pod %s/%s (ofport %d)", a.Namespace, a.Name, port)
		}
	}
	return opsv1alpha1.TraceDelivered, fmt.Sprintf("to ofport %d", port)
}

package netpol

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/datapath/ovsctl"
)

// TracePacket is a synthetic packet for ofproto/trace: the first packet of
// a new connection entering a bridge.
type TracePacket struct {
	// InPort is the OpenFlow port the packet enters on.
	InPort int
	// TunSrc and TunDst (IPv4, optional) are the outer addresses of a
	// packet entering from a flow-based tunnel port.
	TunSrc, TunDst string
	// Protocol is TCP, UDP or SCTP.
	Protocol corev1.Protocol
	// DLSrc and DLDst are the Ethernet addresses.
	DLSrc, DLDst string
	// NWSrc and NWDst are the IPv4 addresses.
	NWSrc, NWDst string
	// TTL is the IP TTL (0 means 64: a zero TTL makes dec_ttl send the
	// packet to the controller instead).
	TTL int
	// SrcPort and DstPort are the transport ports (SrcPort 0 means 40000).
	SrcPort, DstPort int
}

// Flow renders the packet in ovs-ofctl(8) flow syntax, e.g.
// "in_port=3,sctp,dl_src=..,dl_dst=..,nw_src=..,nw_dst=..,nw_ttl=64,sctp_src=40000,sctp_dst=80".
// SCTP ports must be given as sctp_src/sctp_dst (tp_src's prerequisites
// are TCP or UDP only in the flow parser).
func (p TracePacket) Flow() (string, error) {
	var proto, field string
	switch p.Protocol {
	case corev1.ProtocolTCP, "":
		proto, field = "tcp", "tcp"
	case corev1.ProtocolUDP:
		proto, field = "udp", "udp"
	case corev1.ProtocolSCTP:
		proto, field = "sctp", "sctp"
	default:
		return "", fmt.Errorf("trace packet: unknown protocol %q", p.Protocol)
	}
	ttl, sport := p.TTL, p.SrcPort
	if ttl == 0 {
		ttl = 64
	}
	if sport == 0 {
		sport = 40000
	}
	parts := []string{fmt.Sprintf("in_port=%d", p.InPort)}
	if p.TunSrc != "" {
		parts = append(parts, "tun_src="+p.TunSrc)
	}
	if p.TunDst != "" {
		parts = append(parts, "tun_dst="+p.TunDst)
	}
	parts = append(parts, proto)
	for _, kv := range [][2]string{{"dl_src", p.DLSrc}, {"dl_dst", p.DLDst}, {"nw_src", p.NWSrc}, {"nw_dst", p.NWDst}} {
		if kv[1] == "" {
			return "", fmt.Errorf("trace packet: %s is empty", kv[0])
		}
		parts = append(parts, kv[0]+"="+kv[1])
	}
	parts = append(parts, fmt.Sprintf("nw_ttl=%d", ttl), fmt.Sprintf("%s_src=%d", field, sport), fmt.Sprintf("%s_dst=%d", field, p.DstPort))
	return strings.Join(parts, ","), nil
}

// TraceAllowed traces p through bridge of the ovs-vswitchd whose runtime
// directory is ovsRunDir (control socket ovs-vswitchd.ctl), with every
// conntrack recirculation resumed as a new connection (--ct-next trk,new),
// and decides by ParseTrace whether the pipeline outputs the packet. It
// returns the trace text too, for reports. See ovs-vswitchd(8),
// "ofproto/trace".
func TraceAllowed(ctx context.Context, ovsRunDir, bridge string, p TracePacket) (bool, string, error) {
	flow, err := p.Flow()
	if err != nil {
		return false, "", err
	}
	cmd := exec.CommandContext(ctx, "ovs-appctl", "-t", filepath.Join(ovsRunDir, "ovs-vswitchd.ctl"),
		"ofproto/trace", bridge, flow, "--ct-next", "trk,new")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, string(out), fmt.Errorf("ofproto/trace %s %s: %w: %s", bridge, flow, err, strings.TrimSpace(string(out)))
	}
	ok, err := ParseTrace(string(out))
	return ok, string(out), err
}

// ParseTrace decides whether the traced packet leaves the bridge (see
// ovsctl.ParseTrace).
func ParseTrace(out string) (bool, error) {
	t, err := ovsctl.ParseTrace(out)
	return t.Output, err
}

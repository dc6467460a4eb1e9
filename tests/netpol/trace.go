package netpol

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

// ParseTrace decides from ofproto/trace output whether the packet leaves
// the bridge: the "Datapath actions:" of the last pipeline section (after
// the last conntrack recirculation) must output it — to a port (a bare
// datapath port number or output:N) or into a native tunnel (tnl_push).
// "drop", or actions that only modify or commit the packet, mean it was
// dropped. A trace whose OpenFlow pipeline outputs to the native tunnel but
// whose datapath actions lack the tnl_push because the tunnel's neighbour
// (ARP) entry was not resolved yet also counts as output: the verdict of
// the pipeline is "send".
func ParseTrace(out string) (bool, error) {
	last := out
	if i := strings.LastIndex(out, "\n======"); i >= 0 {
		// The last recirculation banner; the section after it is the last.
		last = out[i:]
	}
	line := ""
	for _, l := range strings.Split(last, "\n") {
		if strings.HasPrefix(l, "Datapath actions:") {
			line = strings.TrimSpace(strings.TrimPrefix(l, "Datapath actions:"))
		}
	}
	if line == "" {
		return false, errors.New("trace has no \"Datapath actions:\" line")
	}
	if line == "drop" {
		return false, nil
	}
	for _, a := range splitTopLevel(line) {
		switch {
		case isDigits(a), strings.HasPrefix(a, "output:"), strings.HasPrefix(a, "tnl_push("):
			return true, nil
		case strings.HasPrefix(a, "clone(") && strings.HasSuffix(a, ")"):
			inner, err := ParseTrace("Datapath actions: " + strings.TrimSuffix(strings.TrimPrefix(a, "clone("), ")"))
			if err == nil && inner {
				return true, nil
			}
		case strings.HasPrefix(a, "recirc("):
			return false, fmt.Errorf("trace ends in an unfollowed recirculation: %s", line)
		}
	}
	if strings.Contains(last, "-> output to native tunnel") && strings.Contains(last, "neighbor cache miss") {
		return true, nil
	}
	return false, nil
}

// splitTopLevel splits a datapath action list at commas outside
// parentheses.
func splitTopLevel(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

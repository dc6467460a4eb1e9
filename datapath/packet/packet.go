// Package packet builds and parses the few frames Seine injects into its
// own datapath (Traceflow probes): Ethernet II carrying IPv4 with ICMP
// echo, TCP SYN or UDP, with valid checksums (RFC 791, 792, 793, 768), so
// that connection tracking treats them as the first packet of a
// connection.
package packet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// IP protocol numbers (IANA).
const (
	ProtoICMP uint8 = 1
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
)

// Probe describes one IPv4 packet to build.
type Probe struct {
	SrcMAC, DstMAC   net.HardwareAddr
	SrcIP, DstIP     net.IP
	Protocol         uint8 // ProtoICMP (echo request), ProtoTCP (SYN) or ProtoUDP
	SrcPort, DstPort uint16
	TTL              uint8  // 0 means 64
	ID               uint16 // IP identification, also the ICMP echo identifier
}

// Build returns the Ethernet frame of p.
func Build(p Probe) ([]byte, error) {
	src, dst := p.SrcIP.To4(), p.DstIP.To4()
	if src == nil || dst == nil {
		return nil, fmt.Errorf("packet: IPv4 source and destination required, got %v and %v", p.SrcIP, p.DstIP)
	}
	if len(p.SrcMAC) != 6 || len(p.DstMAC) != 6 {
		return nil, errors.New("packet: source and destination MAC required")
	}
	var l4 []byte
	switch p.Protocol {
	case ProtoICMP:
		l4 = make([]byte, 16) // type 8 code 0, checksum, id, seq, 8 bytes of data
		l4[0] = 8
		binary.BigEndian.PutUint16(l4[4:6], p.ID)
		binary.BigEndian.PutUint16(l4[6:8], 1)
		copy(l4[8:], "seinetf!")
		binary.BigEndian.PutUint16(l4[2:4], checksum(l4, 0))
	case ProtoTCP:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:2], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:4], p.DstPort)
		binary.BigEndian.PutUint32(l4[4:8], uint32(p.ID)<<16|1)
		l4[12] = 5 << 4 // data offset: 5 words
		l4[13] = 0x02   // SYN
		binary.BigEndian.PutUint16(l4[14:16], 64240)
		binary.BigEndian.PutUint16(l4[16:18], checksum(l4, pseudo(src, dst, ProtoTCP, len(l4))))
	case ProtoUDP:
		l4 = make([]byte, 8+8)
		binary.BigEndian.PutUint16(l4[0:2], p.SrcPort)
		binary.BigEndian.PutUint16(l4[2:4], p.DstPort)
		binary.BigEndian.PutUint16(l4[4:6], uint16(len(l4)))
		copy(l4[8:], "seinetf!")
		c := checksum(l4, pseudo(src, dst, ProtoUDP, len(l4)))
		if c == 0 {
			c = 0xffff // RFC 768: a computed zero is sent as all ones
		}
		binary.BigEndian.PutUint16(l4[6:8], c)
	default:
		return nil, fmt.Errorf("packet: protocol %d not supported (ICMP, TCP, UDP)", p.Protocol)
	}
	ttl := p.TTL
	if ttl == 0 {
		ttl = 64
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(ip[4:6], p.ID)
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // don't fragment
	ip[8], ip[9] = ttl, p.Protocol
	copy(ip[12:16], src)
	copy(ip[16:20], dst)
	binary.BigEndian.PutUint16(ip[10:12], checksum(ip, 0))
	frame := make([]byte, 0, 14+len(ip)+len(l4))
	frame = append(frame, p.DstMAC...)
	frame = append(frame, p.SrcMAC...)
	frame = append(frame, 0x08, 0x00)
	frame = append(frame, ip...)
	return append(frame, l4...), nil
}

// pseudo is the one's-complement sum of the TCP/UDP pseudo-header.
func pseudo(src, dst net.IP, proto uint8, l4len int) uint32 {
	var s uint32
	for i := 0; i < 4; i += 2 {
		s += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	return s + uint32(proto) + uint32(l4len)
}

// checksum is the Internet checksum (RFC 1071) of b, starting from sum.
func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// IPv4Header is the part of a frame's IPv4 header Traceflow reports.
type IPv4Header struct {
	Src, Dst net.IP
	Protocol uint8
	TTL      uint8
}

// ParseIPv4 reads the IPv4 header of an Ethernet II frame; ok is false for
// anything else.
func ParseIPv4(frame []byte) (IPv4Header, bool) {
	if len(frame) < 34 || binary.BigEndian.Uint16(frame[12:14]) != 0x0800 || frame[14]>>4 != 4 {
		return IPv4Header{}, false
	}
	ip := frame[14:]
	return IPv4Header{Src: net.IP(append([]byte(nil), ip[12:16]...)), Dst: net.IP(append([]byte(nil), ip[16:20]...)),
		Protocol: ip[9], TTL: ip[8]}, true
}

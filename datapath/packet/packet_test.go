package packet

import (
	"encoding/binary"
	"net"
	"testing"
)

// Every built header checks out: a checksum over the header (or the
// pseudo-header and segment) including its checksum field is zero.
func TestBuildChecksums(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	for _, proto := range []uint8{ProtoICMP, ProtoTCP, ProtoUDP} {
		f, err := Build(Probe{SrcMAC: mac, DstMAC: mac, SrcIP: net.ParseIP("10.244.0.5"), DstIP: net.ParseIP("10.244.1.7"),
			Protocol: proto, SrcPort: 40000, DstPort: 80, ID: 7})
		if err != nil {
			t.Fatal(err)
		}
		ip := f[14:34]
		if c := checksum(ip, 0); c != 0 {
			t.Errorf("proto %d: IP header checksum does not verify (%#x)", proto, c)
		}
		l4 := f[34:]
		sum := uint32(0)
		if proto != ProtoICMP {
			sum = pseudo(ip[12:16], ip[16:20], proto, len(l4))
		}
		if c := checksum(l4, sum); c != 0 {
			t.Errorf("proto %d: L4 checksum does not verify (%#x)", proto, c)
		}
		if int(binary.BigEndian.Uint16(ip[2:4])) != len(f)-14 {
			t.Errorf("proto %d: total length %d, frame carries %d", proto, binary.BigEndian.Uint16(ip[2:4]), len(f)-14)
		}
		h, ok := ParseIPv4(f)
		if !ok || !h.Dst.Equal(net.ParseIP("10.244.1.7")) || h.Protocol != proto || h.TTL != 64 {
			t.Errorf("proto %d: ParseIPv4 = %+v, %v", proto, h, ok)
		}
	}
	if _, err := Build(Probe{SrcIP: net.ParseIP("::1"), DstIP: net.ParseIP("10.0.0.1")}); err == nil {
		t.Error("an IPv6 source was accepted")
	}
}

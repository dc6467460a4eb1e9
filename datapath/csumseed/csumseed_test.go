package csumseed

import (
	"encoding/binary"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/seine-net/seine/datapath/offload"
	"github.com/seine-net/seine/tests/netnstest"
)

// ones returns the 16-bit one's complement sum of b's big-endian words,
// added to sum and folded.
func ones(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum
}

// seed is the pseudo-header sum of a UDP datagram (RFC 768), what a partial
// checksum field holds.
func seed(src, dst net.IP, udpLen int) uint16 {
	ph := append(append([]byte{}, src.To4()...), dst.To4()...)
	ph = append(ph, 0, unix.IPPROTO_UDP, byte(udpLen>>8), byte(udpLen))
	return uint16(ones(0, ph))
}

// frame is an Ethernet frame with an IPv4 UDP datagram whose checksum
// field is field.
func frame(dstMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16, payload []byte, field uint16) []byte {
	udpLen := 8 + len(payload)
	f := make([]byte, 14+20+udpLen)
	copy(f[0:6], dstMAC)
	copy(f[6:12], net.HardwareAddr{0x0e, 0x5f, 0xcc, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], ^uint16(ones(0, ip)))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	copy(udp[8:], payload)
	binary.BigEndian.PutUint16(udp[6:], field)
	return f
}

// fullChecksum is the complete UDP checksum of f (built by frame with
// field 0).
func fullChecksum(f []byte, src, dst net.IP) uint16 {
	udp := f[34:]
	return ^uint16(ones(uint32(seed(src, dst, len(udp))), udp))
}

// vnetHdr is a virtio_net_hdr (include/uapi/linux/virtio_net.h) in the
// packet socket's byte order (the host's, on little-endian machines);
// partial sets NEEDS_CSUM for a UDP checksum at byte 34+6.
func vnetHdr(partial bool) []byte {
	h := make([]byte, 10)
	if partial {
		h[0] = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
		binary.NativeEndian.PutUint16(h[6:], 34)
		binary.NativeEndian.PutUint16(h[8:], 6)
	}
	return h
}

func udpCsumErrors(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var head []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "Udp: ") {
			continue
		}
		fields := strings.Fields(line)[1:]
		if head == nil {
			head = fields
			continue
		}
		for i, h := range head {
			if h == "InCsumErrors" {
				n, err := strconv.Atoi(fields[i])
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
	}
	t.Fatal("no Udp InCsumErrors in /proc/net/snmp")
	return 0
}

// TestProgramLoads checks that the kernel's verifier accepts the program.
func TestProgramLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPartialSeedRewritten writes UDP datagrams, as OVS does, through an
// AF_PACKET socket with a virtio-net header into one end of a veth pair
// whose transmit checksum offload is off, so the kernel completes partial
// checksums there and the other end's UDP checks them. A partial checksum
// whose seed is wrong (what OVS 3.1's NAT leaves) is dropped without the
// program and arrives with it; a complete checksum, right or wrong, is
// left as it came.
func TestPartialSeedRewritten(t *testing.T) {
	netnstest.Run(t, func() {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cs-a"}, PeerName: "cs-b"}); err != nil {
			t.Fatal(err)
		}
		a, err := netlink.LinkByName("cs-a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := netlink.LinkByName("cs-b")
		if err != nil {
			t.Fatal(err)
		}
		src, dst, elsewhere := net.IPv4(198, 18, 77, 1), net.IPv4(198, 18, 77, 2), net.IPv4(198, 18, 77, 99)
		addr, _ := netlink.ParseAddr(dst.String() + "/24")
		if err := netlink.AddrAdd(b, addr); err != nil {
			t.Fatal(err)
		}
		for _, l := range []netlink.Link{a, b} {
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		if err := offload.DisableTx("cs-a"); err != nil {
			t.Fatal(err)
		}
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: dst})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		dport := uint16(conn.LocalAddr().(*net.UDPAddr).Port)

		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: a.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
		bMAC := b.Attrs().HardwareAddr

		// send writes one datagram with payload; partial marks its
		// checksum as the sender's to complete.
		send := func(payload string, partial bool, field uint16) {
			t.Helper()
			f := frame(bMAC, src, dst, 40000, dport, []byte(payload), field)
			if _, err := unix.Write(fd, append(vnetHdr(partial), f...)); err != nil {
				t.Fatalf("writing %q: %v", payload, err)
			}
		}
		// arrives reports whether the datagram with payload reaches the
		// socket (anything else that arrives first fails the test).
		arrives := func(payload string) bool {
			t.Helper()
			buf := make([]byte, 256)
			_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return false
			}
			if got := string(buf[:n]); got != payload {
				t.Fatalf("expected %q, got %q", payload, got)
			}
			return true
		}
		udpLen := func(payload string) int { return 8 + len(payload) }
		rightSeed := func(p string) uint16 { return seed(src, dst, udpLen(p)) }
		wrongSeed := func(p string) uint16 { return seed(src, elsewhere, udpLen(p)) }
		complete := func(p string) uint16 {
			return fullChecksum(frame(bMAC, src, dst, 40000, dport, []byte(p), 0), src, dst)
		}

		// Without the program: the method itself.
		send("partial, right seed", true, rightSeed("partial, right seed"))
		if !arrives("partial, right seed") {
			t.Fatal("a partial checksum with the right seed did not arrive")
		}
		before := udpCsumErrors(t)
		send("partial, wrong seed", true, wrongSeed("partial, wrong seed"))
		if arrives("partial, wrong seed") {
			t.Fatal("a partial checksum with a wrong seed arrived without the program")
		}
		if after := udpCsumErrors(t); after != before+1 {
			t.Fatalf("UDP InCsumErrors went from %d to %d, expected one more", before, after)
		}

		p, err := Load()
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for range 2 { // idempotent
			if err := p.Attach("cs-a", Egress); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := Attached("cs-a", Egress); err != nil || !ok {
			t.Fatalf("Attached after Attach: %v, %v", ok, err)
		}
		if ok, err := Attached("cs-a", Ingress); err != nil || ok {
			t.Fatalf("Attached on the other hook: %v, %v", ok, err)
		}

		for _, c := range []struct {
			payload string
			partial bool
			field   func(string) uint16
			want    bool
		}{
			{"fixed: partial, wrong seed", true, wrongSeed, true},
			{"kept: partial, right seed", true, rightSeed, true},
			{"kept: complete", false, complete, true},
			{"kept: no checksum", false, func(string) uint16 { return 0 }, true},
			// A complete checksum is never rewritten, even a wrong one.
			{"kept: complete, wrong", false, func(p string) uint16 { return complete(p) ^ 0x0f0f }, false},
		} {
			before := udpCsumErrors(t)
			send(c.payload, c.partial, c.field(c.payload))
			if got := arrives(c.payload); got != c.want {
				t.Fatalf("%s: arrived %v, want %v", c.payload, got, c.want)
			}
			if errs := udpCsumErrors(t) - before; (errs == 0) != c.want {
				t.Fatalf("%s: %d checksum errors", c.payload, errs)
			}
		}

		// Detached, the wrong seed is dropped again.
		if err := Detach("cs-a", Egress); err != nil {
			t.Fatal(err)
		}
		if err := Detach("cs-a", Egress); err != nil {
			t.Fatalf("second Detach: %v", err)
		}
		if ok, err := Attached("cs-a", Egress); err != nil || ok {
			t.Fatalf("Attached after Detach: %v, %v", ok, err)
		}
		send("after detach", true, wrongSeed("after detach"))
		if arrives("after detach") {
			t.Fatal("a wrong seed arrived after Detach")
		}
		if err := Detach("no-such-dev", Egress); err != nil {
			t.Fatalf("Detach of a missing device: %v", err)
		}
		if err := Detach("cs-b", Ingress); err != nil {
			t.Fatalf("Detach from a device without a clsact qdisc: %v", err)
		}
	})
}

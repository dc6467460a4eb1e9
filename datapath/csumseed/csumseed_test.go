package csumseed

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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

// seed is the pseudo-header sum of a TCP segment or UDP datagram of l4Len
// bytes (RFC 793 section 3.1, RFC 768), what a partial checksum field
// holds.
func seed(proto byte, src, dst net.IP, l4Len int) uint16 {
	ph := append(append([]byte{}, src.To4()...), dst.To4()...)
	ph = append(ph, 0, proto, byte(l4Len>>8), byte(l4Len))
	return uint16(ones(0, ph))
}

// csumOffset is where the checksum field sits in the transport header.
func csumOffset(proto byte) int {
	if proto == unix.IPPROTO_TCP {
		return 16
	}
	return 6
}

// frame is an Ethernet frame with an IPv4 header of 20+len(options)
// bytes and a UDP datagram, or a TCP SYN, carrying payload, whose checksum
// field is field.
func frame(proto byte, dstMAC net.HardwareAddr, src, dst net.IP, options []byte, sport, dport uint16, payload []byte, field uint16) []byte {
	hl := 20 + len(options)
	l4Hdr := 8
	if proto == unix.IPPROTO_TCP {
		l4Hdr = 20
	}
	l4Len := l4Hdr + len(payload)
	f := make([]byte, 14+hl+l4Len)
	copy(f[0:6], dstMAC)
	copy(f[6:12], net.HardwareAddr{0x0e, 0x5f, 0xcc, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14 : 14+hl]
	ip[0], ip[8], ip[9] = 0x40|byte(hl/4), 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(hl+l4Len))
	copy(ip[12:16], src.To4())
	copy(ip[16:20], dst.To4())
	copy(ip[20:], options)
	binary.BigEndian.PutUint16(ip[10:], ^uint16(ones(0, ip)))
	l4 := f[14+hl:]
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	if proto == unix.IPPROTO_TCP {
		binary.BigEndian.PutUint32(l4[4:], 1000) // sequence number
		l4[12], l4[13] = 5<<4, 0x02              // data offset 5, SYN
		binary.BigEndian.PutUint16(l4[14:], 64240)
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4Len))
	}
	copy(l4[l4Hdr:], payload)
	binary.BigEndian.PutUint16(l4[csumOffset(proto):], field)
	return f
}

// fullChecksum is the complete checksum of f's transport header and
// payload (f built by frame with field 0).
func fullChecksum(proto byte, f []byte, src, dst net.IP) uint16 {
	l4 := f[14+int(f[14]&0x0f)*4:]
	return ^uint16(ones(uint32(seed(proto, src, dst, len(l4))), l4))
}

// vnetHdr is a virtio_net_hdr (include/uapi/linux/virtio_net.h) in the
// packet socket's byte order (the host's, on little-endian machines);
// partial sets NEEDS_CSUM for a checksum at byte csumAt, counted from
// csumStart.
func vnetHdr(partial bool, csumStart, csumAt int) []byte {
	h := make([]byte, 10)
	if partial {
		h[0] = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
		binary.NativeEndian.PutUint16(h[6:], uint16(csumStart))
		binary.NativeEndian.PutUint16(h[8:], uint16(csumAt))
	}
	return h
}

// readSNMP returns the counter name of protocol proto ("Udp", "Tcp") in
// the calling thread's network namespace (/proc/net is the main thread's).
func readSNMP(proto, name string) (int, error) {
	b, err := os.ReadFile("/proc/thread-self/net/snmp")
	if err != nil {
		return 0, err
	}
	var head []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, proto+": ") {
			continue
		}
		fields := strings.Fields(line)[1:]
		if head == nil {
			head = fields
			continue
		}
		for i, h := range head {
			if h == name {
				return strconv.Atoi(fields[i])
			}
		}
	}
	return 0, fmt.Errorf("no %s %s in /proc/thread-self/net/snmp", proto, name)
}

// snmp is readSNMP for the test's goroutine, failing t on error.
func snmp(t *testing.T, proto, name string) int {
	t.Helper()
	n, err := readSNMP(proto, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
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

// TestPartialSeedRewritten writes UDP datagrams and TCP SYNs, as OVS does,
// through an AF_PACKET socket with a virtio-net header into one end of a
// veth pair whose transmit checksum offload is off, so the kernel
// completes partial checksums there and the other end checks them (the
// datagram reaches its socket, the SYN to a closed port is answered with a
// RST, and the namespace's InCsumErrors counters agree). A partial
// checksum whose seed is wrong (what OVS 3.1's NAT leaves) is dropped
// without the program and gets through with it, behind IP options too; a
// complete checksum, right or wrong, is left as it came.
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

		// A packet to send: UDP to the listener (payload tells them
		// apart), or a TCP SYN to a closed port (answered by a RST when
		// its checksum holds); IP options optional.
		type pkt struct {
			proto   byte
			payload string
			options []byte
		}
		l4Len := func(k pkt) int {
			if k.proto == unix.IPPROTO_TCP {
				return 20 + len(k.payload)
			}
			return 8 + len(k.payload)
		}
		build := func(k pkt, field uint16) []byte {
			dport := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
			if k.proto == unix.IPPROTO_TCP {
				dport = 9 // nothing listens
			}
			return frame(k.proto, bMAC, src, dst, k.options, 40000, dport, []byte(k.payload), field)
		}
		rightSeed := func(k pkt) uint16 { return seed(k.proto, src, dst, l4Len(k)) }
		wrongSeed := func(k pkt) uint16 { return seed(k.proto, src, elsewhere, l4Len(k)) }
		complete := func(k pkt) uint16 { return fullChecksum(k.proto, build(k, 0), src, dst) }
		// send writes k with its checksum field set to field; partial
		// marks the checksum as the sender's to complete.
		send := func(k pkt, partial bool, field uint16) {
			t.Helper()
			l4 := 14 + 20 + len(k.options)
			if _, err := unix.Write(fd, append(vnetHdr(partial, l4, csumOffset(k.proto)), build(k, field)...)); err != nil {
				t.Fatalf("writing %q: %v", k.payload, err)
			}
		}
		// arrives reports whether k got through its receiver's checksum:
		// the datagram reaches the socket (anything else arriving first
		// fails the test), or the SYN is answered with a RST. It also
		// checks the protocol's checksum error counter agrees.
		arrives := func(k pkt, sendIt func()) bool {
			t.Helper()
			proto := map[byte]string{unix.IPPROTO_TCP: "Tcp", unix.IPPROTO_UDP: "Udp"}[k.proto]
			errs0, rsts0 := snmp(t, proto, "InCsumErrors"), snmp(t, "Tcp", "OutRsts")
			sendIt()
			var got bool
			if k.proto == unix.IPPROTO_UDP {
				buf := make([]byte, 256)
				_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				n, _, err := conn.ReadFromUDP(buf)
				if err == nil && string(buf[:n]) != k.payload {
					t.Fatalf("expected %q, got %q", k.payload, buf[:n])
				}
				got = err == nil
			} else {
				time.Sleep(200 * time.Millisecond)
				got = snmp(t, "Tcp", "OutRsts") > rsts0
			}
			if errs := snmp(t, proto, "InCsumErrors") - errs0; got == (errs != 0) {
				t.Fatalf("%s %q: got through %v, but %d checksum errors", proto, k.payload, got, errs)
			}
			return got
		}
		udp := pkt{proto: unix.IPPROTO_UDP, payload: "udp"}
		tcp := pkt{proto: unix.IPPROTO_TCP}

		// The kernel activates a veth's qdisc asynchronously once both
		// ends are up (linkwatch); until then frames are dropped without
		// a counter. Wait until a datagram with a complete checksum gets
		// through before asserting anything.
		ready := pkt{proto: unix.IPPROTO_UDP, payload: "ready"}
		deadline := time.Now().Add(10 * time.Second)
		for {
			send(ready, false, complete(ready))
			buf := make([]byte, 256)
			_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if n, _, err := conn.ReadFromUDP(buf); err == nil {
				if string(buf[:n]) != ready.payload {
					t.Fatalf("expected %q, got %q", ready.payload, buf[:n])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the veth pair carried no datagram within 10s")
			}
		}
		// Drain any duplicate of the probe that arrived late.
		for {
			_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, _, err := conn.ReadFromUDP(make([]byte, 256)); err != nil {
				break
			}
		}

		// Without the program: the method itself.
		for _, k := range []pkt{udp, tcp} {
			if !arrives(k, func() { send(k, true, rightSeed(k)) }) {
				t.Fatalf("proto %d: a partial checksum with the right seed did not get through", k.proto)
			}
			if arrives(k, func() { send(k, true, wrongSeed(k)) }) {
				t.Fatalf("proto %d: a partial checksum with a wrong seed got through without the program", k.proto)
			}
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

		withOptions := pkt{proto: unix.IPPROTO_UDP, payload: "udp, IP options", options: []byte{1, 1, 1, 0}}
		for _, c := range []struct {
			name    string
			k       pkt
			partial bool
			field   func(pkt) uint16
			want    bool
		}{
			{"UDP, partial, wrong seed: rewritten", pkt{unix.IPPROTO_UDP, "fixed", nil}, true, wrongSeed, true},
			{"TCP, partial, wrong seed: rewritten", tcp, true, wrongSeed, true},
			{"UDP with IP options, partial, wrong seed: rewritten", withOptions, true, wrongSeed, true},
			{"UDP, partial, right seed: kept", pkt{unix.IPPROTO_UDP, "kept", nil}, true, rightSeed, true},
			{"TCP, partial, right seed: kept", tcp, true, rightSeed, true},
			{"UDP, complete: kept", pkt{unix.IPPROTO_UDP, "complete", nil}, false, complete, true},
			{"TCP, complete: kept", tcp, false, complete, true},
			// A complete checksum is never rewritten, even a wrong one.
			{"UDP, complete, wrong: kept", pkt{unix.IPPROTO_UDP, "complete, wrong", nil}, false,
				func(k pkt) uint16 { return complete(k) ^ 0x0f0f }, false},
			{"TCP, complete, wrong: kept", tcp, false, func(k pkt) uint16 { return complete(k) ^ 0x0f0f }, false},
		} {
			if got := arrives(c.k, func() { send(c.k, c.partial, c.field(c.k)) }); got != c.want {
				t.Fatalf("%s: got through %v, want %v", c.name, got, c.want)
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
		if arrives(udp, func() { send(udp, true, wrongSeed(udp)) }) {
			t.Fatal("a wrong seed got through after Detach")
		}
		if err := Detach("no-such-dev", Egress); err != nil {
			t.Fatalf("Detach of a missing device: %v", err)
		}
		if err := Detach("cs-b", Ingress); err != nil {
			t.Fatalf("Detach from a device without a clsact qdisc: %v", err)
		}
	})
}

// otherNamespace starts a goroutine locked to an OS thread in a new
// network namespace and returns do, which runs f on that thread, and the
// namespace's handle. The thread ends (and the namespace with its last
// reference) at the test's cleanup.
func otherNamespace(t *testing.T) (do func(f func() error) error, ns netns.NsHandle) {
	t.Helper()
	work := make(chan func(), 1)
	ready := make(chan error, 1)
	var handle netns.NsHandle
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		h, err := netns.New()
		handle = h
		ready <- err
		if err != nil {
			return // the locked thread exits with the goroutine
		}
		for f := range work {
			f()
		}
		h.Close()
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(work) })
	return func(f func() error) error {
		errc := make(chan error, 1)
		work <- func() { errc <- f() }
		return <-errc
	}, handle
}

// TestGatewayIngress checks the Ingress hook on a tap, the gateway's kind
// of device: ovs-vswitchd writes the packet into the tap with a
// virtio-net header, the host forwards it out of a device without
// checksum offload, where the kernel completes the checksum from the seed,
// and a second namespace checks it. (A packet the host delivers locally
// proves nothing: the stack trusts a partial checksum.) A wrong seed is
// dropped there without the program and gets through with it.
func TestGatewayIngress(t *testing.T) {
	netnstest.Run(t, func() {
		tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "cs-gw"}, Mode: netlink.TUNTAP_MODE_TAP,
			Queues: 1, // the library keeps the queues' files only when asked for a number
			Flags:  netlink.TUNTAP_DEFAULTS | netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR, NonPersist: true}
		if err := netlink.LinkAdd(tap); err != nil {
			t.Fatal(err)
		}
		defer func() {
			for _, f := range tap.Fds {
				f.Close()
			}
		}()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cs-o"}, PeerName: "cs-p"}); err != nil {
			t.Fatal(err)
		}
		gwIP, podIP := net.IPv4(198, 18, 78, 1), net.IPv4(198, 18, 78, 2)
		outIP, dst, elsewhere := net.IPv4(198, 18, 79, 1), net.IPv4(198, 18, 79, 2), net.IPv4(198, 18, 79, 99)
		for name, ip := range map[string]net.IP{"cs-gw": gwIP, "cs-o": outIP} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		if err := offload.DisableTx("cs-o"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		gw, err := netlink.LinkByName("cs-gw")
		if err != nil {
			t.Fatal(err)
		}

		// The receiver: cs-p in a namespace of its own, a UDP socket there.
		inPeer, peerNS := otherNamespace(t)
		peer, err := netlink.LinkByName("cs-p")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetNsFd(peer, int(peerNS)); err != nil {
			t.Fatal(err)
		}
		var conn *net.UDPConn
		if err := inPeer(func() error {
			l, err := netlink.LinkByName("cs-p")
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: dst, Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			// A route back to the sender, for hosts whose namespaces
			// inherit a strict rp_filter.
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: outIP}); err != nil {
				return err
			}
			conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: dst})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		csumErrors := func() int {
			t.Helper()
			var n int
			if err := inPeer(func() (err error) { n, err = readSNMP("Udp", "InCsumErrors"); return err }); err != nil {
				t.Fatal(err)
			}
			return n
		}

		dport := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
		build := func(payload string, field uint16) []byte {
			return frame(unix.IPPROTO_UDP, gw.Attrs().HardwareAddr, podIP, dst, nil, 40000, dport, []byte(payload), field)
		}
		l4Len := func(payload string) int { return 8 + len(payload) }
		// send writes a frame into the tap as ovs-vswitchd does.
		send := func(partial bool, f []byte) {
			t.Helper()
			if _, err := tap.Fds[0].Write(append(vnetHdr(partial, 14+20, csumOffset(unix.IPPROTO_UDP)), f...)); err != nil {
				t.Fatal(err)
			}
		}
		// arrives reports whether payload reached the receiver within
		// wait; anything else arriving fails the test.
		arrives := func(payload string, wait time.Duration) bool {
			t.Helper()
			buf := make([]byte, 256)
			_ = conn.SetReadDeadline(time.Now().Add(wait))
			n, _, err := conn.ReadFromUDP(buf)
			if err == nil && string(buf[:n]) != payload {
				t.Fatalf("expected %q, got %q", payload, buf[:n])
			}
			return err == nil
		}
		// Ready once a complete checksum gets through (the peer's address
		// resolved, both veth ends active).
		for deadline := time.Now().Add(10 * time.Second); ; {
			f := build("ready", 0)
			binary.BigEndian.PutUint16(f[14+20+6:], fullChecksum(unix.IPPROTO_UDP, f, podIP, dst))
			send(false, f)
			if arrives("ready", 100*time.Millisecond) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("nothing forwarded from the tap to the peer within 10s")
			}
		}
		for arrives("ready", 50*time.Millisecond) { // late duplicates of the probe
		}

		check := func(name, payload string, field uint16, want bool) {
			t.Helper()
			errs0 := csumErrors()
			send(true, build(payload, field))
			got := arrives(payload, 500*time.Millisecond)
			if errs := csumErrors() - errs0; got == (errs != 0) {
				t.Fatalf("%s: got through %v, but %d checksum errors at the receiver", name, got, errs)
			}
			if got != want {
				t.Fatalf("%s: got through %v, want %v", name, got, want)
			}
		}
		right := func(p string) uint16 { return seed(unix.IPPROTO_UDP, podIP, dst, l4Len(p)) }
		wrong := func(p string) uint16 { return seed(unix.IPPROTO_UDP, podIP, elsewhere, l4Len(p)) }

		check("without the program, right seed", "right", right("right"), true)
		check("without the program, wrong seed", "wrong", wrong("wrong"), false)

		p, err := Load()
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Attach("cs-gw", Ingress); err != nil {
			t.Fatal(err)
		}
		check("with the program, wrong seed", "fixed", wrong("fixed"), true)
		check("with the program, right seed", "kept", right("kept"), true)
	})
}

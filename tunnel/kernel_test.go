package tunnel

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/ovstest"
	"github.com/seine-net/seine/tests/netnstest"
)

func nftNetdev(t *testing.T, table string) knftables.Interface {
	t.Helper()
	nft, err := knftables.New(knftables.NetDevFamily, table)
	if err != nil {
		t.Fatal(err)
	}
	return nft
}

func hasTable(table string) bool {
	return exec.Command("nft", "list", "table", "netdev", table).Run() == nil
}

func peerIPs(t *testing.T, k KernelVXLAN) []string {
	t.Helper()
	ips, err := k.Peers()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

// TestKernelVXLAN creates the kernel tunnel device in a fresh namespace and
// checks its settings, idempotence, the per-peer forwarding entries, its
// replacement when the local address changes, a name taken by another
// kind of device, and removal.
func TestKernelVXLAN(t *testing.T) {
	netnstest.Run(t, func() {
		ctx := context.Background()
		nft := nftNetdev(t, "seine-tunnel")
		k := KernelVXLAN{Name: "tv0"}
		local := net.ParseIP("198.19.250.1")
		if err := k.Ensure(ctx, nft, local, 1450); err != nil {
			t.Fatal(err)
		}
		link, err := netlink.LinkByName("tv0")
		if err != nil {
			t.Fatal(err)
		}
		vx, ok := link.(*netlink.Vxlan)
		if !ok {
			t.Fatalf("tv0 is a %s device", link.Type())
		}
		if vx.VxlanId != 0 || vx.Port != VXLANPort || vx.Learning || !vx.SrcAddr.Equal(local) || vx.MTU != 1450 ||
			vx.Flags&net.FlagUp == 0 {
			t.Fatalf("tv0: VNI %d port %d learning %v local %s MTU %d flags %v", vx.VxlanId, vx.Port, vx.Learning,
				vx.SrcAddr, vx.MTU, vx.Flags)
		}
		if !hasTable("seine-tunnel") {
			t.Fatal("no ingress drop table")
		}
		if out, _ := exec.Command("nft", "list", "table", "netdev", "seine-tunnel").CombinedOutput(); !strings.Contains(string(out), `devices = { "tv0" }`) &&
			!strings.Contains(string(out), `device "tv0"`) {
			t.Fatalf("ingress chain not on tv0:\n%s", out)
		}
		if err := k.Ensure(ctx, nft, local, 1400); err != nil {
			t.Fatal(err)
		}
		again, _ := netlink.LinkByName("tv0")
		if again.Attrs().Index != link.Attrs().Index || again.Attrs().MTU != 1400 {
			t.Fatalf("second Ensure: index %d (was %d), MTU %d", again.Attrs().Index, link.Attrs().Index, again.Attrs().MTU)
		}

		for _, ip := range []string{"198.19.250.2", "198.19.250.3"} {
			if err := k.AddPeer(net.ParseIP(ip)); err != nil {
				t.Fatal(err)
			}
		}
		if err := k.AddPeer(net.ParseIP("198.19.250.3")); err != nil {
			t.Fatalf("adding a peer twice: %v", err)
		}
		if got := peerIPs(t, k); !slices.Equal(got, []string{"198.19.250.2", "198.19.250.3"}) {
			t.Fatalf("peers %v", got)
		}
		fdb, _ := exec.Command("bridge", "fdb", "show", "dev", "tv0").CombinedOutput()
		if !strings.Contains(string(fdb), "0e:5f:c6:13:fa:02 dst 198.19.250.2 self permanent") {
			t.Fatalf("forwarding entry of 198.19.250.2 missing:\n%s", fdb)
		}
		if err := k.RemovePeer(net.ParseIP("198.19.250.2")); err != nil {
			t.Fatal(err)
		}
		if err := k.RemovePeer(net.ParseIP("198.19.250.2")); err != nil {
			t.Fatalf("removing a missing peer: %v", err)
		}
		if got := peerIPs(t, k); !slices.Equal(got, []string{"198.19.250.3"}) {
			t.Fatalf("peers after removal %v", got)
		}

		// A new local address cannot be changed in place: the device is
		// recreated.
		if err := k.Ensure(ctx, nft, net.ParseIP("198.19.250.9"), 1450); err != nil {
			t.Fatal(err)
		}
		moved, _ := netlink.LinkByName("tv0")
		if vx := moved.(*netlink.Vxlan); !vx.SrcAddr.Equal(net.ParseIP("198.19.250.9")) {
			t.Fatalf("local address %s after Ensure with a new one", vx.SrcAddr)
		}

		if err := k.Remove(ctx, nft); err != nil {
			t.Fatal(err)
		}
		if _, err := netlink.LinkByName("tv0"); err == nil || hasTable("seine-tunnel") {
			t.Fatalf("device or table left after Remove (link error %v)", err)
		}
		if err := k.Remove(ctx, nft); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
		if err := k.RemovePeer(net.ParseIP("198.19.250.3")); err != nil {
			t.Fatalf("RemovePeer without a device: %v", err)
		}

		ipCmd(t, "link", "add", "tv1", "type", "veth", "peer", "name", "tv2")
		err = KernelVXLAN{Name: "tv1"}.Ensure(ctx, nft, local, 1450)
		if err == nil || !strings.Contains(err.Error(), "veth device, not vxlan") {
			t.Fatalf("Ensure over a veth: %v, want an error naming the kind", err)
		}
		if _, err := netlink.LinkByName("tv1"); err != nil {
			t.Fatalf("the veth was touched: %v", err)
		}
	})
}

// TestSegmentPair checks the segmentation veth pair: the port has no
// transmit checksum or segmentation offload, the hairpin end keeps its
// defaults, both are up with the MTU given, a frame sent out of the port
// comes back in on it (the hairpin), and Ensure is idempotent (one
// hairpin filter after two).
func TestSegmentPair(t *testing.T) {
	netnstest.Run(t, func() {
		s := SegmentPair{Port: "ts0", Hairpin: "ts1"}
		for i := 0; i < 2; i++ {
			if err := s.Ensure(1450); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"ts0", "ts1"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if l.Attrs().MTU != 1450 || l.Attrs().Flags&net.FlagUp == 0 {
				t.Fatalf("%s: MTU %d flags %v", name, l.Attrs().MTU, l.Attrs().Flags)
			}
		}
		feats := func(dev string) string {
			out, err := exec.Command("ethtool", "-k", dev).CombinedOutput()
			if err != nil {
				t.Fatalf("ethtool -k %s: %v: %s", dev, err, out)
			}
			return string(out)
		}
		if f := feats("ts0"); !strings.Contains(f, "tx-checksumming: off") || !strings.Contains(f, "tcp-segmentation-offload: off") {
			t.Fatalf("ts0 keeps transmit offloads:\n%s", f)
		}
		if f := feats("ts1"); !strings.Contains(f, "tx-checksumming: on") {
			t.Fatalf("ts1 lost its offloads:\n%s", f)
		}
		hairpin, err := netlink.LinkByName("ts1")
		if err != nil {
			t.Fatal(err)
		}
		filters, err := netlink.FilterList(hairpin, netlink.HANDLE_MIN_INGRESS)
		if err != nil || len(filters) != 1 {
			t.Fatalf("ts1's ingress filters after two Ensure: %d (%v), want 1", len(filters), err)
		}
		if got := hairpinEcho(t, "ts0"); !got {
			t.Fatal("a frame sent out of ts0 did not come back in on it")
		}
		if err := s.Remove(); err != nil {
			t.Fatal(err)
		}
		if _, err := netlink.LinkByName("ts1"); err == nil {
			t.Fatal("ts1 left after Remove")
		}
		if err := s.Remove(); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
	})
}

// hairpinEcho sends one Ethernet frame (the local experimental EtherType
// 0x88b5) out of dev through an AF_PACKET socket and reports whether the
// socket then receives it as incoming on dev (as OVS's socket would).
func hairpinEcho(t *testing.T, dev string) bool {
	t.Helper()
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	const ethType = 0x88b5
	proto := int(ethType>>8 | (ethType&0xff)<<8) // network byte order
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	addr := &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.Attrs().Index}
	if err := unix.Bind(fd, addr); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(2 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, 64)
	copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // broadcast
	copy(frame[6:], l.Attrs().HardwareAddr)
	frame[12], frame[13] = ethType>>8, ethType&0xff
	copy(frame[14:], "seine hairpin")
	if err := unix.Sendto(fd, frame, 0, addr); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false // timeout
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if ok && ll.Pkttype != unix.PACKET_OUTGOING && n >= 27 && string(buf[14:27]) == "seine hairpin" {
			return true
		}
	}
}

// TestDetachNetdevForKernelTunnel attaches a transport interface to a
// transport bridge and detaches it again, as a Node does when its tunnel
// moves to a kernel VXLAN device: the address and the route come back to
// the interface, GRO (off while OVS reads the interface) comes back on,
// the ingress drop and the bridge go, and a Node without the bridge is
// left alone.
func TestDetachNetdevForKernelTunnel(t *testing.T) {
	netnstest.Run(t, func() {
		ipCmd(t, "link", "add", "tt0", "type", "veth", "peer", "name", "tt1")
		ipCmd(t, "addr", "add", "198.19.249.1/24", "dev", "tt0")
		ipCmd(t, "link", "set", "tt0", "up")
		ipCmd(t, "link", "set", "tt1", "up")
		ipCmd(t, "route", "add", "198.19.248.0/24", "via", "198.19.249.2")
		mac, _ := netlink.LinkByName("tt0")

		o := ovstest.Start(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		log := zaptest.NewLogger(t)
		c, err := ovsdb.Dial(ctx, o.DBSocket(), log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		nft := nftNetdev(t, "seine-transport")
		if _, err := AttachNetdev(ctx, c, nft, "br-tt", "tt0", log); err != nil {
			t.Fatal(err)
		}
		addrOn := func(dev string) bool {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return false
			}
			addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
			for _, a := range addrs {
				if a.IP.Equal(net.ParseIP("198.19.249.1")) {
					return true
				}
			}
			return false
		}
		if !addrOn("br-tt") || addrOn("tt0") || !hasTable("seine-transport") {
			t.Fatal("AttachNetdev did not move the address or drop the kernel's ingress")
		}
		gro := func() string {
			out, _ := exec.Command("ethtool", "-k", "tt0").CombinedOutput()
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "generic-receive-offload:") {
					return strings.TrimSpace(strings.TrimPrefix(l, "generic-receive-offload:"))
				}
			}
			return string(out)
		}
		if g := gro(); g != "off" {
			t.Fatalf("GRO on the attached transport device: %q, want off", g)
		}

		if err := DetachNetdev(ctx, c, nft, "br-tt", log); err != nil {
			t.Fatal(err)
		}
		if !addrOn("tt0") || addrOn("br-tt") {
			t.Fatalf("after DetachNetdev: address on tt0 %v, on br-tt %v", addrOn("tt0"), addrOn("br-tt"))
		}
		routes, _ := netlink.RouteGet(net.ParseIP("198.19.248.7"))
		if len(routes) != 1 || routes[0].LinkIndex != mac.Attrs().Index {
			t.Fatalf("route to 198.19.248.0/24 not back on tt0: %+v", routes)
		}
		if hasTable("seine-transport") {
			t.Fatal("ingress drop left on tt0")
		}
		if g := gro(); g != "on" {
			t.Fatalf("GRO on the detached transport device: %q, want on", g)
		}
		if _, err := c.ListPorts(ctx, "br-tt"); err == nil {
			t.Fatal("transport bridge still in OVSDB")
		}
		if l, _ := netlink.LinkByName("tt0"); l.Attrs().HardwareAddr.String() != mac.Attrs().HardwareAddr.String() {
			t.Fatalf("tt0 changed MAC: %s, was %s", l.Attrs().HardwareAddr, mac.Attrs().HardwareAddr)
		}
		if err := DetachNetdev(ctx, c, nft, "br-tt", log); err != nil {
			t.Fatalf("DetachNetdev without a bridge: %v", err)
		}
	})
}

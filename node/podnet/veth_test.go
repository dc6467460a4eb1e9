package podnet

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	cniserver "github.com/seine-net/seine/node/cni/server"
	"github.com/seine-net/seine/tests/netnstest"
)

// TestCreateVeth creates a Pod's veth pair from a fresh namespace standing
// in for the host's: the host end stays there with its MAC, down,
// promiscuous and with no IPv6 address generation; the Pod's end is in the Pod's namespace
// with the requested name, MAC and MTU. Once both ends are up the host end
// gets no IPv6 address. A second pair whose Pod end would clash
// fails with EEXIST and leaves no host end behind.
func TestCreateVeth(t *testing.T) {
	netnstest.Run(t, func() {
		podNS, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = podNS.Close()
			_ = testutils.UnmountNS(podNS)
		}()

		mac, err := randomMAC()
		if err != nil {
			t.Fatal(err)
		}
		hostMAC, err := randomMAC()
		if err != nil {
			t.Fatal(err)
		}
		if mac[0]&0x03 != 0x02 {
			t.Errorf("MAC %s is not unicast and locally administered", mac)
		}
		if _, err := createVeth(podNS, "svtest0", hostMAC, "eth0", mac, 1400); err != nil {
			t.Fatal(err)
		}
		host, err := netlink.LinkByName("svtest0")
		if err != nil {
			t.Fatal(err)
		}
		a := host.Attrs()
		if a.Name != "svtest0" || a.MTU != 1400 || a.Promisc != 1 || a.Flags&net.FlagUp != 0 || a.HardwareAddr.String() != hostMAC.String() {
			t.Errorf("host end: name %s, MTU %d, promisc %d, flags %v, MAC %s; want svtest0, 1400, promiscuous, down, %s",
				a.Name, a.MTU, a.Promisc, a.Flags, a.HardwareAddr, hostMAC)
		}
		out, err := exec.Command("ip", "-d", "link", "show", "svtest0").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "addrgenmode none") {
			t.Errorf("host end's IPv6 address generation is not none: %s %v", out, err)
		}

		var pod netlink.Link
		if err := podNS.Do(func(ns.NetNS) error {
			var err error
			if pod, err = netlink.LinkByName("eth0"); err != nil {
				return err
			}
			return netlink.LinkSetUp(pod)
		}); err != nil {
			t.Fatalf("Pod end: %v", err)
		}
		if pod.Attrs().MTU != 1400 || pod.Attrs().HardwareAddr.String() != mac.String() {
			t.Errorf("Pod end MTU %d, MAC %s; want 1400, %s", pod.Attrs().MTU, pod.Attrs().HardwareAddr, mac)
		}
		if err := netlink.LinkSetUp(host); err != nil {
			t.Fatal(err)
		}
		// The kernel adds a link-local address up to a few seconds after
		// an interface that generates one gets its carrier (it waits for
		// the link to settle), so absence is watched for 3 seconds.
		if _, err := os.Stat("/proc/sys/net/ipv6"); err == nil {
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				addrs, err := netlink.AddrList(host, netlink.FAMILY_V6)
				if err != nil {
					t.Fatal(err)
				}
				if len(addrs) != 0 {
					t.Errorf("host end has IPv6 addresses %v, want none", addrs)
					break
				}
			}
		}

		_, err = createVeth(podNS, "svtest1", hostMAC, "eth0", mac, 1400)
		if !errors.Is(err, syscall.EEXIST) {
			t.Errorf("second pair with the same Pod end: err %v, want EEXIST", err)
		}
		if _, err := netlink.LinkByName("svtest1"); err == nil {
			t.Error("the failed pair left its host end svtest1")
		}
	})
}

// TestAddOverLeftovers adds Pods on a real bridge where earlier attempts
// left things behind. A host end of the same name (as an ADD that died
// before its rollback leaves) is replaced, and the ADD succeeds. An
// interface that already has the requested name in the Pod's namespace
// fails the ADD with the datapath error naming it, and the ADD leaves
// nothing behind.
func TestAddOverLeftovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))

	req := h.request(0, h.netns().Path())
	stale := HostVethName(req.ContainerID, req.IfName)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: stale}, PeerName: "lo" + h.prefix[1:9]}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteLink(stale) })
	res, err := h.be.Add(ctx, req)
	if err != nil {
		t.Fatalf("ADD over a leftover host end: %v", err)
	}
	if link, err := netlink.LinkByName(stale); err != nil || link.Attrs().HardwareAddr.String() != res.Interfaces[0].Mac {
		t.Errorf("host end %s after the ADD: %v %v, want the new veth with MAC %s", stale, link, err, res.Interfaces[0].Mac)
	}
	if _, err := netlink.LinkByName("lo" + h.prefix[1:9]); err == nil {
		t.Error("the leftover pair is still there")
	}
	if err := h.be.Del(ctx, req); err != nil {
		t.Fatal(err)
	}

	podNS := h.netns()
	if err := podNS.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"})
	}); err != nil {
		t.Fatal(err)
	}
	_, err = h.be.Add(ctx, h.request(1, podNS.Path()))
	var cerr *cniserver.Error
	if !errors.As(err, &cerr) || cerr.Code != cniserver.ErrCodeDatapath || !strings.Contains(cerr.Msg, "eth0") || !errors.Is(err, syscall.EEXIST) {
		t.Errorf("ADD with eth0 taken in the Pod's namespace: %v, want a datapath error naming eth0, wrapping EEXIST", err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestAddRollsBackWhenThePodEndFails adds a Pod whose namespace already
// has a default route, so configuring the Pod's end fails (EEXIST) while
// the host end is attached to the bridge concurrently. The ADD fails with
// the datapath error naming the route, and the rollback leaves no IP, OVS
// port, flow or veth.
func TestAddRollsBackWhenThePodEndFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	podNS := h.netns()
	if err := podNS.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "x0", Flags: net.FlagUp}, PeerName: "x1"}); err != nil {
			return err
		}
		x0, err := netlink.LinkByName("x0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("198.18.255.1/30")
		if err := netlink.AddrAdd(x0, addr); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: x0.Attrs().Index, Gw: net.ParseIP("198.18.255.2")})
	}); err != nil {
		t.Fatal(err)
	}
	_, err := h.be.Add(ctx, h.request(0, podNS.Path()))
	var cerr *cniserver.Error
	if !errors.As(err, &cerr) || cerr.Code != cniserver.ErrCodeDatapath || !strings.Contains(cerr.Msg, "route") ||
		!errors.Is(err, syscall.EEXIST) {
		t.Errorf("ADD into a namespace that has a default route: %v, want a datapath error about the route, wrapping EEXIST", err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

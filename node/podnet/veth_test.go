package podnet

import (
	"errors"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/tests/netnstest"
)

// TestCreateVeth creates a Pod's veth pair from a fresh namespace standing
// in for the host's: the host end stays there, down, promiscuous and with
// no IPv6 address generation; the Pod's end is in the Pod's namespace
// with the requested name, MAC and MTU. Once both ends are up the host end
// still has no IPv6 address. A second pair whose Pod end would clash
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
		if mac[0]&0x03 != 0x02 {
			t.Errorf("MAC %s is not unicast and locally administered", mac)
		}
		if _, err := createVeth(podNS, "svtest0", "eth0", mac, 1400); err != nil {
			t.Fatal(err)
		}
		host, err := netlink.LinkByName("svtest0")
		if err != nil {
			t.Fatal(err)
		}
		a := host.Attrs()
		if a.Name != "svtest0" || a.MTU != 1400 || a.Promisc != 1 || a.Flags&net.FlagUp != 0 {
			t.Errorf("host end: name %s, MTU %d, promisc %d, flags %v; want svtest0, 1400, promiscuous, down",
				a.Name, a.MTU, a.Promisc, a.Flags)
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
		// The kernel adds a link-local address (tentative) as soon as an
		// interface that generates one has a carrier.
		addrs, err := netlink.AddrList(host, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 0 {
			t.Errorf("host end has IPv6 addresses %v, want none", addrs)
		}

		_, err = createVeth(podNS, "svtest1", "eth0", mac, 1400)
		if !errors.Is(err, syscall.EEXIST) {
			t.Errorf("second pair with the same Pod end: err %v, want EEXIST", err)
		}
		if _, err := netlink.LinkByName("svtest1"); err == nil {
			t.Error("the failed pair left its host end svtest1")
		}
	})
}

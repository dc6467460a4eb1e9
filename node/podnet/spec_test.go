package podnet

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/ipam"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// TestAddTwiceRefused adds a Pod, then the same container and interface
// again without a DEL (CNI spec, "ADD"): the second ADD fails with code 4
// naming both, and the first attachment keeps its IP, port, flows, MACs
// and the address inside the Pod. DEL then removes everything.
func TestAddTwiceRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	podNS := h.netns()
	req := h.request(0, podNS.Path())
	res, err := h.be.Add(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ip := res.IPs[0].Address.IP

	_, err = h.be.Add(ctx, req)
	var cerr *cniserver.Error
	if !errors.As(err, &cerr) || cerr.Code != types.ErrInvalidEnvironmentVariables ||
		!strings.Contains(cerr.Msg, req.ContainerID) || !strings.Contains(cerr.Msg, "eth0") || !strings.Contains(cerr.Msg, ip.String()) {
		t.Fatalf("second ADD of %s/eth0: %v, want CNI error 4 naming the container, the interface and %s", req.ContainerID, err, ip)
	}

	if got, ok := h.ipam.Lookup(req.ContainerID, "eth0"); !ok || !got.Equal(ip) {
		t.Errorf("IP after the refused ADD: %v %v, want %s", got, ok, ip)
	}
	host := res.Interfaces[0].Name
	if link, err := netlink.LinkByName(host); err != nil || link.Attrs().HardwareAddr.String() != res.Interfaces[0].Mac {
		t.Errorf("host end %s after the refused ADD: %v %v, want MAC %s", host, link, err, res.Interfaces[0].Mac)
	}
	if p, err := h.db.GetPort(ctx, host); err != nil || p == nil || p.OFPort <= 0 {
		t.Errorf("port %s after the refused ADD: %+v %v", host, p, err)
	}
	if !h.flows.Has(owner(req.ContainerID, "eth0")) {
		t.Error("the Pod's flows went with the refused ADD")
	}
	if err := podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if link.Attrs().HardwareAddr.String() != res.Interfaces[1].Mac {
			t.Errorf("Pod eth0 MAC %s, want %s", link.Attrs().HardwareAddr, res.Interfaces[1].Mac)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(ip) }) {
			t.Errorf("Pod eth0 addresses %v, want %s", addrs, ip)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.be.Del(ctx, req); err != nil {
		t.Fatal(err)
	}
	// An address held without a port (as a rollback that could not
	// remove its flows keeps it) is no attachment: the ADD uses it.
	held := h.request(1, h.netns().Path())
	heldIP, err := h.ipam.Allocate(ipam.Owner{ContainerID: held.ContainerID, IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = h.be.Add(ctx, held)
	if err != nil || !res.IPs[0].Address.IP.Equal(heldIP) {
		t.Fatalf("ADD of an attachment holding only its address %s: %v, %v", heldIP, res, err)
	}
	if err := h.be.Del(ctx, held); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestAddAfterAnEarlierPlugin adds a Pod with a prevResult, as a runtime
// does when a plugin runs before seine in the chain: the result keeps the
// earlier plugin's interfaces, addresses, routes and DNS, and seine's
// address points at seine's Pod interface after them.
func TestAddAfterAnEarlierPlugin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	req := h.request(0, h.netns().Path())
	zero := 0
	_, dst, _ := net.ParseCIDR("198.18.10.0/24")
	req.NetConf.PrevResult = &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: "net9", Sandbox: req.Netns}},
		IPs:        []*current.IPConfig{{Address: net.IPNet{IP: net.ParseIP("198.18.10.5").To4(), Mask: net.CIDRMask(24, 32)}, Interface: &zero}},
		Routes:     []*types.Route{{Dst: *dst}},
		DNS:        types.DNS{Nameservers: []string{"198.18.10.53"}},
	}
	res, err := h.be.Add(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.be.Del(context.Background(), req) })

	var names []string
	for _, itf := range res.Interfaces {
		names = append(names, itf.Name)
	}
	if len(names) != 3 || names[0] != "net9" || names[2] != "eth0" {
		t.Fatalf("interfaces %v, want net9, the host veth, eth0", names)
	}
	if len(res.IPs) != 2 || !res.IPs[0].Address.IP.Equal(net.ParseIP("198.18.10.5")) || *res.IPs[0].Interface != 0 ||
		res.IPs[1].Interface == nil || *res.IPs[1].Interface != 2 {
		t.Errorf("IPs %v, want the earlier plugin's on interface 0, then seine's on interface 2", res.IPs)
	}
	if len(res.Routes) < 2 || res.Routes[0].Dst.String() != "198.18.10.0/24" {
		t.Errorf("routes %v, want the earlier plugin's first", res.Routes)
	}
	if !slices.Equal(res.DNS.Nameservers, []string{"198.18.10.53"}) {
		t.Errorf("DNS %+v, want the earlier plugin's", res.DNS)
	}
	if *req.NetConf.PrevResult.(*current.Result).IPs[0].Interface != 0 {
		t.Error("the prevResult given was changed")
	}
}

// TestGCOnlyItsNetwork attaches one Pod for network "blue" and one for
// "green", then GCs "blue" with neither listed as valid: blue's is
// released, green's (another network's, CNI spec 1.1 "GC") keeps its IP,
// port, flows and veth; a GC of "green" then releases it. An address
// recorded without a network (before the network was) goes with the
// first GC; one of network "red" without a port stays through both.
func TestGCOnlyItsNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	blue := h.request(0, h.netns().Path())
	blue.NetConf.Name = "blue"
	green := h.request(1, h.netns().Path())
	green.NetConf.Name = "green"
	for _, r := range []*cniserver.Request{blue, green} {
		if _, err := h.be.Add(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	gc := func(network string) {
		t.Helper()
		if err := h.be.GC(ctx, &cniserver.Request{Command: cniserver.CmdGC, NetConf: &cniserver.NetConf{NetConf: types.NetConf{Name: network}}}, nil); err != nil {
			t.Fatalf("GC of %s: %v", network, err)
		}
	}
	legacy := ipam.Owner{ContainerID: h.prefix + "-legacy", IfName: "eth0"}
	red := ipam.Owner{ContainerID: h.prefix + "-red", IfName: "eth0", Network: "red"}
	for _, o := range []ipam.Owner{legacy, red} {
		if _, err := h.ipam.Allocate(o); err != nil {
			t.Fatal(err)
		}
	}
	gc("blue")
	if _, ok := h.ipam.Lookup(legacy.ContainerID, "eth0"); ok {
		t.Error("GC of blue kept the address recorded without a network")
	}
	if _, ok := h.ipam.Lookup(blue.ContainerID, "eth0"); ok {
		t.Error("GC of blue kept blue's IP")
	}
	if _, err := netlink.LinkByName(HostVethName(blue.ContainerID, "eth0")); err == nil {
		t.Error("GC of blue kept blue's veth")
	}
	if _, ok := h.ipam.Lookup(green.ContainerID, "eth0"); !ok {
		t.Error("GC of blue released green's IP")
	}
	if p, err := h.db.GetPort(ctx, HostVethName(green.ContainerID, "eth0")); err != nil || p == nil {
		t.Errorf("GC of blue removed green's port: %v", err)
	}
	if !h.flows.Has(owner(green.ContainerID, "eth0")) {
		t.Error("GC of blue removed green's flows")
	}
	if _, err := netlink.LinkByName(HostVethName(green.ContainerID, "eth0")); err != nil {
		t.Errorf("GC of blue removed green's veth: %v", err)
	}
	gc("green")
	if _, ok := h.ipam.Lookup(red.ContainerID, "eth0"); !ok {
		t.Error("a GC of blue or green released red's address")
	}
	if err := h.ipam.Release(red.ContainerID, "eth0"); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(ctx); len(left) != 0 {
		t.Errorf("left behind after both GCs: %v", left)
	}
}

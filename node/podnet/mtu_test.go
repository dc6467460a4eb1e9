package podnet

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
)

// TestRouteMTU adds two Pods on a real bridge, the Backend configured as
// a tunnelling Node's (interface MTU 1500, routes through the gateway
// 1450). The first gets a 1500-byte interface (both veth ends), its
// default route and a link route to the gateway's address carry 1450, and
// the kernel picks 1450 for an address off the Node and the interface's
// 1500 for one in the podCIDR; the CNI result lists the routes with their
// MTU. The second Pod's network configuration sets mtu 1400, which then
// holds everywhere: no route MTU, no gateway route.
func TestRouteMTU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t), func(c *Config) { c.MTU, c.RouteMTU = 1500, 1450 })

	// inPod runs ip in the Pod's namespace and returns its output.
	inPod := func(n ns.NetNS, f func() (string, error)) string {
		t.Helper()
		var out string
		if err := n.Do(func(ns.NetNS) error {
			var err error
			out, err = f()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	routeMTU := func(dst string) func() (string, error) {
		return func() (string, error) {
			rs, err := netlink.RouteGet(net.ParseIP(dst))
			if err != nil || len(rs) == 0 {
				return "", err
			}
			return strconv.Itoa(rs[0].MTU), nil
		}
	}
	ifMTU := func() (string, error) {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return "", err
		}
		return strconv.Itoa(l.Attrs().MTU), nil
	}

	n0 := h.netns()
	req0 := h.request(0, n0.Path())
	res, err := h.be.Add(ctx, req0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.be.Del(context.Background(), req0) })
	if got := inPod(n0, ifMTU); got != "1500" {
		t.Errorf("Pod interface MTU %s, want 1500", got)
	}
	host, err := netlink.LinkByName(res.Interfaces[0].Name)
	if err != nil || host.Attrs().MTU != 1500 {
		t.Errorf("host veth %s: %v, MTU %d; want 1500", res.Interfaces[0].Name, err, host.Attrs().MTU)
	}
	// RouteGet reports the MTU metric of the route it picks (0: none, the
	// interface's).
	for dst, want := range map[string]string{"10.244.9.7": "1450", "10.96.0.10": "1450", "10.244.0.1": "1450", "10.244.0.9": "0"} {
		if got := inPod(n0, routeMTU(dst)); got != want {
			t.Errorf("route MTU towards %s: %s, want %s", dst, got, want)
		}
	}
	var listed []string
	for _, r := range res.Routes {
		listed = append(listed, r.Dst.String()+" mtu "+strconv.Itoa(r.MTU))
	}
	if got := strings.Join(listed, ", "); got != "10.244.0.1/32 mtu 1450, 0.0.0.0/0 mtu 1450" {
		t.Errorf("CNI result routes: %s", got)
	}

	n1 := h.netns()
	req := h.request(1, n1.Path())
	req.NetConf.MTU = 1400
	res, err = h.be.Add(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.be.Del(context.Background(), req) })
	if got := inPod(n1, ifMTU); got != "1400" {
		t.Errorf("Pod interface MTU with mtu 1400 configured: %s", got)
	}
	if got := inPod(n1, routeMTU("10.244.9.7")); got != "0" {
		t.Errorf("route MTU with mtu 1400 configured: %s, want none", got)
	}
	if len(res.Routes) != 1 || res.Routes[0].MTU != 0 {
		t.Errorf("CNI result routes with mtu 1400 configured: %v", res.Routes)
	}
}

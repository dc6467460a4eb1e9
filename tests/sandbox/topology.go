package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Addresses of the sandbox network (all from 198.18.0.0/15, RFC 2544's
// benchmarking range, which no real network routes).
const (
	underlayRouter   = "198.18.0.254"
	controlPlaneIP   = "198.18.0.1"
	extRouterCIDR    = "198.19.0.254/16"
	extRouter        = "198.19.0.254"
	externalIP       = "198.19.0.10"
	externalPrefix   = 16
	hostLinkHostCIDR = "198.18.255.1/30"
	hostLinkCPIP     = "198.18.255.2"
	hostLinkCPCIDR   = "198.18.255.2/30"
	// ClusterCIDR is the Pod address range Nodes' podCIDRs are cut from.
	ClusterCIDR = "10.244.0.0/16"
	// ServiceCIDR is the ClusterIP range.
	ServiceCIDR = "10.96.0.0/16"
)

func netnsPath(name string) string { return filepath.Join("/run/netns", name) }

// nsName is "seine-<sandbox>-<suffix>".
func nsName(sandbox, suffix string) string { return "seine-" + sandbox + "-" + suffix }

func underlayNS(sandbox string) string { return nsName(sandbox, "underlay") }
func cpNS(sandbox string) string       { return nsName(sandbox, "cp") }
func extNS(sandbox string) string      { return nsName(sandbox, "ext") }
func nodeNS(sandbox string, i int) string {
	return nsName(sandbox, fmt.Sprintf("node-%d", i))
}

// hostLinkName is the host side of the optional host link, "seine-<name>".
func hostLinkName(sandbox string) string { return "seine-" + sandbox }

// nodeIP is the underlay address of Node i (1-based) in transport subnet
// s (0-based): 198.18.s.(10+i).
func nodeIP(s, i int) string { return fmt.Sprintf("198.18.%d.%d", s, 10+i) }

// subnetRouter is the router's address in transport subnet s,
// 198.18.s.254 (s = 0 is underlayRouter).
func subnetRouter(s int) string { return fmt.Sprintf("198.18.%d.254", s) }

// subnetBridge is the underlay bridge of transport subnet s.
func subnetBridge(s int) string { return fmt.Sprintf("br%d", s) }

// subnetOf splits Nodes 1..nodes over subnets transport subnets in
// contiguous runs (3 Nodes over 2: Nodes 1 and 2 in subnet 0, Node 3 in
// subnet 1).
func subnetOf(i, nodes, subnets int) int { return (i - 1) * subnets / nodes }

// ownNetNS matches every namespace name a sandbox creates, and nothing of
// a sandbox with another name.
func ownNetNS(sandbox string) *regexp.Regexp {
	return regexp.MustCompile(`^seine-` + regexp.QuoteMeta(sandbox) + `-(underlay|cp|ext|node-[0-9]+|pod-[0-9a-f-]{1,8})$`)
}

// listNetNS returns the sandbox's namespaces found in /run/netns.
func listNetNS(sandbox string) []string {
	entries, _ := os.ReadDir("/run/netns")
	re := ownNetNS(sandbox)
	var out []string
	for _, e := range entries {
		if re.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// builder runs `ip` commands and remembers the first error.
type builder struct {
	ctx context.Context
	err error
}

func (b *builder) ip(args ...string) {
	if b.err != nil {
		return
	}
	_, b.err = run(b.ctx, nil, append([]string{"ip"}, args...)...)
}

func (b *builder) sysctl(ns string, kv ...string) {
	for _, s := range kv {
		if b.err != nil {
			return
		}
		_, b.err = run(b.ctx, nil, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", s)
	}
}

// wire makes a veth end behave like a physical NIC without offloads: it
// turns off transmit checksum and segmentation offload, so what it sends is
// complete on the wire (MTU-sized frames with their checksums; the kernel
// segments in software before it). On a host's end (host) it also turns
// on GRO, which every NIC driver does (NAPI), so received frames of one
// flow are aggregated before the stack, a kernel VXLAN device and OVS see
// them; the underlay's ends stand for switch ports and do not aggregate.
// Without the first, the kernel would hand partially checksummed frames
// across the veth, which OVS's userspace datapath without userspace TSO
// (reading through AF_PACKET) would forward unfixed; without the second,
// a veth hands each frame up on its own, which no real Node's NIC does.
func (b *builder) wire(ns, dev string, host bool) {
	if b.err != nil {
		return
	}
	args := []string{"ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off"}
	if host {
		args = append(args, "gro", "on")
	}
	_, b.err = run(b.ctx, nil, args...)
}

func (b *builder) addNS(name string) {
	b.ip("netns", "add", name)
	b.ip("-n", name, "link", "set", "lo", "up")
}

// attach creates a veth from the underlay bridge br to eth0 in ns with
// addr (CIDR) and a default route via gw; port is the underlay-side name.
func (b *builder) attach(sandbox, br, port, ns, addr, gw string) {
	u := underlayNS(sandbox)
	b.ip("-n", u, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
	b.ip("-n", u, "link", "set", port, "master", br, "up")
	b.wire(u, port, false)
	b.wire(ns, "eth0", true)
	b.ip("-n", ns, "addr", "add", addr, "dev", "eth0")
	b.ip("-n", ns, "link", "set", "eth0", "up")
	b.ip("-n", ns, "route", "add", "default", "via", gw)
}

// buildTopology creates the underlay (one bridge per transport subnet, the
// namespace routing between them), control-plane, external-host and Node
// namespaces and, when hostLink, the host veth.
func buildTopology(ctx context.Context, sandbox string, nodes, subnets int, hostLink bool) error {
	b := &builder{ctx: ctx}
	u := underlayNS(sandbox)
	b.addNS(u)
	for s := 0; s < subnets; s++ {
		b.ip("-n", u, "link", "add", subnetBridge(s), "type", "bridge")
		b.ip("-n", u, "link", "set", subnetBridge(s), "up")
		b.ip("-n", u, "addr", "add", subnetRouter(s)+"/24", "dev", subnetBridge(s))
	}
	b.sysctl(u, "net.ipv4.ip_forward=1")

	cp := cpNS(sandbox)
	b.addNS(cp)
	b.attach(sandbox, subnetBridge(0), "cp", cp, controlPlaneIP+"/24", underlayRouter)

	for i := 1; i <= nodes; i++ {
		n := nodeNS(sandbox, i)
		s := subnetOf(i, nodes, subnets)
		b.addNS(n)
		b.attach(sandbox, subnetBridge(s), fmt.Sprintf("n%d", i), n, nodeIP(s, i)+"/24", subnetRouter(s))
		b.sysctl(n, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=2", "net.ipv4.conf.default.rp_filter=2")
	}

	ext := extNS(sandbox)
	b.addNS(ext)
	b.ip("-n", u, "link", "add", "ext", "type", "veth", "peer", "name", "eth0", "netns", ext)
	b.ip("-n", u, "addr", "add", extRouterCIDR, "dev", "ext")
	b.ip("-n", u, "link", "set", "ext", "up")
	b.wire(u, "ext", false)
	b.wire(ext, "eth0", true)
	b.ip("-n", ext, "addr", "add", fmt.Sprintf("%s/%d", externalIP, externalPrefix), "dev", "eth0")
	b.ip("-n", ext, "link", "set", "eth0", "up")
	b.ip("-n", ext, "route", "add", "default", "via", extRouter)

	if hostLink {
		h := hostLinkName(sandbox)
		b.ip("link", "add", h, "type", "veth", "peer", "name", "host0", "netns", cp)
		b.ip("addr", "add", hostLinkHostCIDR, "dev", h)
		b.ip("link", "set", h, "up")
		b.ip("-n", cp, "addr", "add", hostLinkCPCIDR, "dev", "host0")
		b.ip("-n", cp, "link", "set", "host0", "up")
	}
	if b.err != nil {
		return fmt.Errorf("build network topology: %w", b.err)
	}
	return nil
}

// deleteNetNS removes a named namespace even when `ip netns del` fails
// (e.g. the bind mount is already gone): it unmounts and removes the file.
func deleteNetNS(ctx context.Context, name string) error {
	if _, err := run(ctx, nil, "ip", "netns", "del", name); err == nil {
		return nil
	}
	p := netnsPath(name)
	_ = unix.Unmount(p, unix.MNT_DETACH)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// deleteHostLink removes the host side of the host link if it exists.
func deleteHostLink(sandbox string) error {
	l, err := netlink.LinkByName(hostLinkName(sandbox))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || strings.Contains(err.Error(), "not found") {
			return nil
		}
		return fmt.Errorf("look up host link: %w", err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete host link %s: %w", hostLinkName(sandbox), err)
	}
	return nil
}

// netnsPids returns the pids of processes in the named namespace.
func netnsPids(ctx context.Context, name string) []int {
	out, err := run(ctx, nil, "ip", "netns", "pids", name)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		var pid int
		if _, err := fmt.Sscanf(f, "%d", &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

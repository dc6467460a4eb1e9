package podnet

// Chained attachments (trafficEncapMode networkPolicyOnly). A routed
// primary CNI (AWS VPC CNI, containernetworking's ptp, ...) has given the
// Pod its address and a point-to-point veth, with a host route
// "<Pod IP>/32 dev <host veth>". Seine, chained after it, puts itself in
// the middle without changing what either end sees:
//
//   - the host veth becomes a port of the integration bridge, and the
//     kernel stops answering ARP on it and forwarding what arrives on it
//     (arp_ignore=8, forwarding=0: with the userspace datapath the kernel
//     still receives the veth's packets besides OVS, and a second path
//     around the bridge would bypass NetworkPolicy);
//   - the host route moves to the gateway interface (source: the Node IP),
//     so the host reaches the Pod through the bridge;
//   - the bridge answers the Pod's ARP requests itself (pipeline.Bridge
//     PolicyOnly), so the Pod's neighbour entries are flushed once to be
//     learned again from it.
//
// DEL puts everything back as the primary left it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsdb"
	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/bandwidth"
	cniserver "github.com/seine-net/seine/node/cni/server"
)

// OVSDB external_ids keys of chained attachments (beside the ExtID* keys
// of every Pod port).
const (
	// ExtIDAttachment is "chained" on the port of a Pod whose interface a
	// primary CNI created.
	ExtIDAttachment = "seine.io/attachment"
	// ExtIDHostSysctls records the host veth's sysctls as the primary
	// left them ("arp_ignore=0,forwarding=1"), restored by DEL.
	ExtIDHostSysctls = "seine.io/host-sysctls"
)

// AttachmentChained is the ExtIDAttachment value of chained attachments.
const AttachmentChained = "chained"

// PodRouteProtocol marks the host routes to chained Pods that seine moved
// onto the gateway (rtnetlink rtm_protocol, values above 4 are free).
const PodRouteProtocol netlink.RouteProtocol = 0x60

// chainedSysctls are the per-interface IPv4 sysctls a chained host veth
// gets, and the order they are recorded in.
var chainedSysctls = []struct{ name, value string }{
	{"arp_ignore", "8"}, // ip-sysctl: 8 - do not reply for any local address
	{"forwarding", "0"}, // packets received on the veth are not routed
}

func sysctlPath(dev, name string) string {
	return filepath.Join("/proc/sys/net/ipv4/conf", dev, name)
}

// setHostSysctls applies chainedSysctls to dev and returns the values it
// replaced, as recorded in ExtIDHostSysctls.
func setHostSysctls(dev string) (string, error) {
	var old []string
	for _, s := range chainedSysctls {
		b, err := os.ReadFile(sysctlPath(dev, s.name))
		if err != nil {
			return "", fmt.Errorf("sysctl %s of %s: %w", s.name, dev, err)
		}
		old = append(old, s.name+"="+strings.TrimSpace(string(b)))
		if err := os.WriteFile(sysctlPath(dev, s.name), []byte(s.value), 0o644); err != nil {
			return "", fmt.Errorf("sysctl %s of %s: %w", s.name, dev, err)
		}
	}
	return strings.Join(old, ","), nil
}

// restoreHostSysctls writes back what setHostSysctls recorded.
func restoreHostSysctls(dev, recorded string) error {
	var errs []error
	for _, kv := range strings.Split(recorded, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.ContainsAny(k, "/.") {
			continue
		}
		if err := os.WriteFile(sysctlPath(dev, k), []byte(v), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sysctl %s of %s: %w", k, dev, err))
		}
	}
	return errors.Join(errs...)
}

// podHostRoute is the /32 route to a Pod: on dev as the primary CNI made
// it, or, with the gateway, as seine moves it.
func (b *Backend) podHostRoute(podIP net.IP, dev netlink.Link, onGateway bool) *netlink.Route {
	r := &netlink.Route{LinkIndex: dev.Attrs().Index, Dst: &net.IPNet{IP: podIP.To4(), Mask: net.CIDRMask(32, 32)},
		Scope: netlink.SCOPE_LINK}
	if onGateway {
		r.Protocol = PodRouteProtocol
		r.Src = b.cfg.NodeIP
	}
	return r
}

// chainedPodIP returns the IPv4 address prev gives the interface ifName.
func chainedPodIP(prev *current.Result, ifName string) (net.IP, error) {
	for _, c := range prev.IPs {
		if c.Address.IP.To4() == nil {
			continue
		}
		if c.Interface != nil && *c.Interface >= 0 && *c.Interface < len(prev.Interfaces) {
			if itf := prev.Interfaces[*c.Interface]; itf.Name != ifName || itf.Sandbox == "" {
				continue
			}
		}
		return c.Address.IP.To4(), nil
	}
	return nil, fmt.Errorf("prevResult gives %s no IPv4 address", ifName)
}

// addChained attaches a Pod whose interface the primary CNI created.
func (b *Backend) addChained(ctx context.Context, req *cniserver.Request) (_ *current.Result, retErr error) {
	if req.NetConf.PrevResult == nil {
		return nil, cniserver.Errorf(types.ErrInvalidNetworkConfig,
			"seine runs in networkPolicyOnly mode: it must be chained after the primary CNI plugin, whose result it needs (no prevResult)")
	}
	prev, err := current.NewResultFromResult(req.NetConf.PrevResult)
	if err != nil {
		return nil, cniserver.Errorf(types.ErrInvalidNetworkConfig, "prevResult: %w", err)
	}
	podIP, err := chainedPodIP(prev, req.IfName)
	if err != nil {
		return nil, cniserver.Errorf(types.ErrInvalidNetworkConfig, "%w", err)
	}
	podNS, err := ns.GetNS(req.Netns)
	if err != nil {
		return nil, cniserver.Errorf(types.ErrInvalidEnvironmentVariables, "CNI_NETNS %q: %w", req.Netns, err)
	}
	defer podNS.Close()

	var undo rollback
	defer func() {
		if retErr != nil {
			undo.run()
		}
	}()

	// The Pod side: its MAC, its veth peer, and neighbour entries to
	// learn again from the bridge.
	var podMAC net.HardwareAddr
	var peerIndex int
	err = podNS.Do(func(ns.NetNS) error {
		link, idx, err := ip.GetVethPeerIfindex(req.IfName)
		if err != nil {
			return fmt.Errorf("the primary CNI's interface %s is not a veth: %w", req.IfName, err)
		}
		podMAC, peerIndex = link.Attrs().HardwareAddr, idx
		neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("neighbours of %s: %w", req.IfName, err)
		}
		for _, n := range neighs {
			if n.State&netlink.NUD_PERMANENT == 0 {
				_ = netlink.NeighDel(&n)
			}
		}
		if b.cfg.DisableTxChecksum {
			return disableTxChecksum(req.IfName)
		}
		return nil
	})
	if err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "the Pod's interface: %w", err)
	}
	hostLink, err := netlink.LinkByIndex(peerIndex)
	if err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "host end (ifindex %d) of %s: %w", peerIndex, req.IfName, err)
	}
	hostName := hostLink.Attrs().Name
	gw, err := netlink.LinkByName(b.cfg.Gateway)
	if err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "gateway %s: %w", b.cfg.Gateway, err)
	}

	recorded, err := setHostSysctls(hostName)
	undo.add(func() {
		if err := restoreHostSysctls(hostName, recorded); err != nil {
			b.log.Error("rollback: host veth sysctls", zap.String("veth", hostName), zap.Error(err))
		}
	})
	if err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", err)
	}
	if b.cfg.DisableTxChecksum {
		if err := disableTxChecksum(hostName); err != nil {
			return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "%w", err)
		}
	}
	// The primary's chain shapes the Pod's traffic.
	port, err := b.attach(ctx, req, hostName, podIP, podMAC, bandwidth.Limits{},
		map[string]string{ExtIDAttachment: AttachmentChained, ExtIDHostSysctls: recorded}, &undo, newStepTimes(), nil)
	if err != nil {
		return nil, err
	}
	// The host route: onto the gateway, off the veth.
	if err := netlink.RouteReplace(b.podHostRoute(podIP, gw, true)); err != nil {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "route to %s via %s: %w", podIP, b.cfg.Gateway, err)
	}
	undo.add(func() { b.restorePodRoute(podIP, hostName) })
	if err := netlink.RouteDel(b.podHostRoute(podIP, hostLink, false)); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, cniserver.Errorf(cniserver.ErrCodeDatapath, "removing the route to %s via %s: %w", podIP, hostName, err)
	}
	b.log.Info("Pod attached (chained)", zap.String("pod", req.PodNamespace+"/"+req.PodName),
		zap.String("container_id", req.ContainerID), zap.String("ip", podIP.String()),
		zap.String("port", hostName), zap.Int32("ofport", port.OFPort))
	// A chained plugin passes the result on (CNI spec, "Chained plugins").
	return prev, nil
}

// restorePodRoute puts the /32 route to podIP back on the host veth (if
// it still exists) and removes seine's route on the gateway.
func (b *Backend) restorePodRoute(podIP net.IP, hostVeth string) {
	if veth, err := netlink.LinkByName(hostVeth); err == nil {
		if err := netlink.RouteReplace(b.podHostRoute(podIP, veth, false)); err != nil {
			b.log.Warn("restoring the route to a chained Pod", zap.String("ip", podIP.String()), zap.Error(err))
		}
		return
	}
	if gw, err := netlink.LinkByName(b.cfg.Gateway); err == nil {
		if err := netlink.RouteDel(b.podHostRoute(podIP, gw, true)); err != nil && !errors.Is(err, syscall.ESRCH) {
			b.log.Warn("removing the route to a chained Pod", zap.String("ip", podIP.String()), zap.Error(err))
		}
	}
}

// chainedPort finds the port of a chained attachment; nil when there is
// none.
func (b *Backend) chainedPort(ctx context.Context, containerID, ifName string) (*ovsdb.Port, error) {
	ports, err := b.ports.ListPorts(ctx, b.cfg.BridgeName)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		if p.ExternalIDs[ExtIDContainerID] == containerID && p.ExternalIDs[ExtIDIfName] == ifName {
			return &p, nil
		}
	}
	return nil, nil
}

// releaseChained detaches a chained Pod, leaving its interface and route
// as the primary CNI made them; whatever is already gone is skipped.
func (b *Backend) releaseChained(ctx context.Context, containerID, ifName string) error {
	b.forget(owner(containerID, ifName))
	if err := b.flows.Set(ctx, owner(containerID, ifName), nil); err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "removing Pod flows: %w", err)
	}
	port, err := b.chainedPort(ctx, containerID, ifName)
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "listing ports: %w", err)
	}
	if port == nil {
		return nil
	}
	if err := b.ports.DeletePort(ctx, b.cfg.BridgeName, port.Name); err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "removing OVS port %s: %w", port.Name, err)
	}
	if port.OFPort > 0 {
		b.ofports.release(uint32(port.OFPort))
	}
	if podIP := net.ParseIP(port.ExternalIDs[ExtIDIP]).To4(); podIP != nil {
		b.restorePodRoute(podIP, port.Name)
	}
	if _, err := netlink.LinkByName(port.Name); err == nil {
		if err := restoreHostSysctls(port.Name, port.ExternalIDs[ExtIDHostSysctls]); err != nil {
			b.log.Warn("restoring host veth sysctls", zap.String("veth", port.Name), zap.Error(err))
		}
	}
	b.log.Info("Pod detached (chained)", zap.String("container_id", containerID), zap.String("port", port.Name))
	return nil
}

// checkChained verifies a chained attachment: its port, flows and route
// onto the gateway are in place.
func (b *Backend) checkChained(ctx context.Context, req *cniserver.Request, prev *current.Result) error {
	if prev == nil {
		return cniserver.Errorf(types.ErrInvalidNetworkConfig, "CHECK needs a prevResult")
	}
	podIP, err := chainedPodIP(prev, req.IfName)
	if err != nil {
		return cniserver.Errorf(types.ErrInvalidNetworkConfig, "%w", err)
	}
	port, err := b.chainedPort(ctx, req.ContainerID, req.IfName)
	if err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "listing ports: %w", err)
	}
	if port == nil {
		return cniserver.Errorf(types.ErrUnknownContainer, "container %s is not attached to %s", req.ContainerID, b.cfg.BridgeName)
	}
	if got := net.ParseIP(port.ExternalIDs[ExtIDIP]); !got.Equal(podIP) {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "attachment records %s, prevResult %s", got, podIP)
	}
	if _, err := netlink.LinkByName(port.Name); err != nil {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "host veth %s: %w", port.Name, err)
	}
	if !b.flows.Has(owner(req.ContainerID, req.IfName)) {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "no flows installed for container %s", req.ContainerID)
	}
	routes, err := netlink.RouteGet(podIP)
	if err != nil || len(routes) == 0 {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "no route to %s: %v", podIP, err)
	}
	gw, err := netlink.LinkByName(b.cfg.Gateway)
	if err != nil || routes[0].LinkIndex != gw.Attrs().Index {
		return cniserver.Errorf(cniserver.ErrCodeDatapath, "the route to %s does not use %s", podIP, b.cfg.Gateway)
	}
	return nil
}

// restoreChained reinstalls a chained Pod's flows and gateway route at
// start-up, or releases the attachment when its veth is gone. It reports
// whether the Pod's flows are installed. A live Pod whose port has no
// OpenFlow number stays attached, and so without traffic, rather than go
// back to its primary CNI's routing outside its NetworkPolicies; the error
// says so.
func (b *Backend) restoreChained(ctx context.Context, p ovsdb.Port) (bool, error) {
	cid, ifn := p.ExternalIDs[ExtIDContainerID], p.ExternalIDs[ExtIDIfName]
	podIP := net.ParseIP(p.ExternalIDs[ExtIDIP]).To4()
	mac, merr := net.ParseMAC(p.ExternalIDs[ExtIDMAC])
	if _, err := netlink.LinkByName(p.Name); err != nil || podIP == nil || merr != nil {
		b.log.Info("releasing stale chained Pod port", zap.String("port", p.Name), zap.String("container_id", cid))
		return false, b.releaseChained(ctx, cid, ifn)
	}
	if p.OFPort <= 0 {
		return false, fmt.Errorf("ovs-vswitchd gives its port no OpenFlow number (ofport %d); it stays attached, "+
			"without traffic, rather than leave its NetworkPolicies", p.OFPort)
	}
	gw, err := netlink.LinkByName(b.cfg.Gateway)
	if err != nil {
		return false, fmt.Errorf("gateway %s: %w", b.cfg.Gateway, err)
	}
	if err := netlink.RouteReplace(b.podHostRoute(podIP, gw, true)); err != nil {
		return false, fmt.Errorf("route to %s: %w", podIP, err)
	}
	iso := p.ExternalIDs[ExtIDIsolation]
	pod := pipeline.Pod{OFPort: uint32(p.OFPort), IP: podIP, MAC: mac,
		IngressIsolated: strings.Contains(iso, "ingress"), EgressIsolated: strings.Contains(iso, "egress")}
	if err := b.flows.Set(ctx, owner(cid, ifn), pipeline.PodFlows(b.cfg.Bridge, pod)); err != nil {
		return false, &flowsRefused{err}
	}
	b.remember(p.ExternalIDs[ExtIDPodNamespace], p.ExternalIDs[ExtIDPodName], podRecord{owner: owner(cid, ifn), port: p.Name, pod: pod}, true)
	return true, nil
}

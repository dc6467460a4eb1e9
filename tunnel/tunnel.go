// Package tunnel knows Seine's overlay: the encapsulation overhead and OVS
// options of each tunnel type, how to find the transport interface that
// carries tunnel traffic, and, for the userspace (netdev) datapath, how to
// hand that interface to an OVS bridge so OVS's native tunnelling can send
// and receive through it, and how to keep OVS's tunnel neighbor cache
// filled for the peers.
package tunnel

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// Tunnel types.
const (
	Geneve = "geneve"
	VXLAN  = "vxlan"
	GRE    = "gre"
)

// Overhead is the number of bytes an IPv4 encapsulation adds to a Pod's
// IPv4 packet, so the largest packet a tunnel carries in one transport
// packet, the tunnel MTU, is transport MTU - Overhead. (In the modes that
// tunnel, and without a configured mtu, the agent gives the tunnel MTU to
// the tunnel and segmentation ports, the gateway and the Pods' routes
// through it, and the transport MTU itself to Pod interfaces: node/agent
// podMTUs.) Per type:
//   - geneve: outer IPv4 (20) + UDP (8) + Geneve base header (8, RFC 8926
//     section 3.4, no options) + inner Ethernet (14) = 50
//   - vxlan:  outer IPv4 (20) + UDP (8) + VXLAN header (8, RFC 7348
//     section 5) + inner Ethernet (14) = 50
//   - gre:    outer IPv4 (20) + GRE header with key (8, RFC 2890) + inner
//     Ethernet (14, transparent Ethernet bridging) = 42
func Overhead(tunnelType string) (int, error) {
	switch tunnelType {
	case Geneve, VXLAN:
		return 50, nil
	case GRE:
		return 42, nil
	}
	return 0, fmt.Errorf("unknown tunnel type %q", tunnelType)
}

// Known reports whether tunnelType is one Seine builds (geneve, vxlan,
// gre).
func Known(tunnelType string) bool {
	_, err := Overhead(tunnelType)
	return err == nil
}

// PortOptions are the Interface options of a flow-based tunnel port: the
// remote end and key come from each packet's tun_dst and tun_id
// (ovs-vswitchd.conf.db(5), "Tunnel Options").
func PortOptions(tunnelType string) (map[string]string, error) {
	if _, err := Overhead(tunnelType); err != nil {
		return nil, err
	}
	return map[string]string{"remote_ip": "flow", "key": "flow"}, nil
}

// Transport is the interface that carries tunnel traffic between Nodes.
type Transport struct {
	Name  string
	Index int
	MTU   int
	MAC   net.HardwareAddr
	// Addrs are its IPv4 addresses (the Node IP among them).
	Addrs []netlink.Addr
}

// FindTransport returns the interface named name or, when name is empty,
// the interface holding nodeIP.
func FindTransport(name string, nodeIP net.IP) (Transport, error) {
	var link netlink.Link
	var err error
	if name != "" {
		link, err = netlink.LinkByName(name)
		if err != nil {
			return Transport{}, fmt.Errorf("transport interface %q: %w", name, err)
		}
	} else {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return Transport{}, fmt.Errorf("listing addresses: %w", err)
		}
		for _, a := range addrs {
			if a.IP.Equal(nodeIP) {
				link, err = netlink.LinkByIndex(a.LinkIndex)
				if err != nil {
					return Transport{}, fmt.Errorf("interface of Node IP %s: %w", nodeIP, err)
				}
				break
			}
		}
		if link == nil {
			return Transport{}, fmt.Errorf("no interface holds the Node IP %s; set transportInterface", nodeIP)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return Transport{}, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	return Transport{
		Name:  link.Attrs().Name,
		Index: link.Attrs().Index,
		MTU:   link.Attrs().MTU,
		MAC:   link.Attrs().HardwareAddr,
		Addrs: addrs,
	}, nil
}

// Kind is how a Node builds its tunnel.
type Kind int

const (
	// KindOVSPort is OVS's flow-based tunnel port. With the kernel
	// datapath the openvswitch module encapsulates; with the userspace
	// datapath ovs-vswitchd does, and sends through the transport bridge
	// (AttachNetdev).
	KindOVSPort Kind = iota
	// KindKernelDevice is a kernel VXLAN device attached to the bridge as
	// an ordinary port (KernelVXLAN): the kernel encapsulates and segments,
	// and the transport interface stays the kernel's.
	KindKernelDevice
)

// String names the kind as logs and docs do.
func (k Kind) String() string {
	if k == KindKernelDevice {
		return "kernel-device"
	}
	return "ovs-port"
}

// Choose picks the tunnel's kind for a datapath and tunnel type: with the
// userspace datapath, VXLAN goes through a kernel VXLAN device, which
// encapsulates segmentation-offloaded packets and leaves the outer packets
// to the kernel's own stack and GRO; every other case uses OVS's tunnel
// port. Geneve and GRE stay on OVS's port with the userspace datapath
// because a kernel Geneve or GRETAP device carries one fixed remote end
// (no forwarding database to pick a peer per packet) and the kernel may
// lack their modules.
func Choose(userspaceDatapath bool, tunnelType string) Kind {
	if userspaceDatapath && tunnelType == VXLAN {
		return KindKernelDevice
	}
	return KindOVSPort
}

// DefaultType is the tunnel type of a cluster whose configuration leaves
// tunnelType empty and whose Nodes have not chosen one yet: vxlan with the
// userspace datapath, where a kernel VXLAN device encapsulates and segments
// (Choose; OVS 3.1's userspace Geneve and GRE ports encapsulate one segment
// at a time, a fifth of the throughput or less in docs/benchmarks.md), and
// geneve with the kernel datapath.
func DefaultType(userspaceDatapath bool) string {
	if userspaceDatapath {
		return VXLAN
	}
	return Geneve
}

// TypeSource says where PickType found a Node's tunnel type.
type TypeSource string

// Sources of the tunnel type, in PickType's order of precedence.
const (
	FromConfig    TypeSource = "configuration"
	FromBridge    TypeSource = "this Node's tunnel port"
	FromAgentInfo TypeSource = "this Node's AgentInfo"
	FromPeers     TypeSource = "the other Nodes"
	FromDefault   TypeSource = "the datapath's default"
)

// TypeEvidence is what a Node knows of tunnel types when it starts.
type TypeEvidence struct {
	// Configured is tunnelType from the configuration ("" when unset).
	Configured string
	// Bridge is the type of the tunnel port its previous run left on the
	// integration bridge ("" when there is none).
	Bridge string
	// Reported is the type its AgentInfo reports, from its previous run.
	Reported string
	// Peers counts the other Nodes by the type their AgentInfos report.
	Peers map[string]int
	// UserspaceDatapath: OVS runs the netdev datapath.
	UserspaceDatapath bool
}

// PickType decides a Node's tunnel type. Nodes reach each other only when
// they encapsulate alike, so a default never changes the wire format of a
// running cluster. In order:
//   - the configured type, when set (the operator's choice, even if peers
//     differ);
//   - the type of this Node's previous run: its tunnel port, else its
//     AgentInfo, so a restart or an upgrade keeps it;
//   - the type most other Nodes report (ties go to the datapath's default,
//     then to the first in name order), so a Node that joins a running
//     cluster speaks its language;
//   - DefaultType.
//
// A configured type is returned as is (Config's validation checks it);
// elsewhere, empty and unknown types are ignored.
func PickType(e TypeEvidence) (string, TypeSource) {
	switch {
	case e.Configured != "":
		return e.Configured, FromConfig
	case Known(e.Bridge):
		return e.Bridge, FromBridge
	case Known(e.Reported):
		return e.Reported, FromAgentInfo
	}
	def := DefaultType(e.UserspaceDatapath)
	best, bestN := "", 0
	for t, n := range e.Peers {
		if !Known(t) || n <= 0 {
			continue
		}
		better := n > bestN ||
			n == bestN && (t == def || best != def && t < best)
		if better {
			best, bestN = t, n
		}
	}
	if best != "" {
		return best, FromPeers
	}
	return def, FromDefault
}

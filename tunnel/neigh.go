package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
)

// Appctl runs one ovs-vswitchd control command (see datapath/ovsctl).
type Appctl interface {
	Run(ctx context.Context, method string, params ...string) (string, error)
}

// Neighbors keeps the userspace datapath's tunnel neighbor cache filled
// for the Nodes this one tunnels to.
//
// OVS's native tunnelling resolves the outer destination MAC from its own
// cache ("tnl/neigh", ovs-vswitchd(8)), which it fills by snooping ARP
// replies that reach the bridge. On a miss it sends an ARP request and
// drops the packet, so the first packet towards each peer Node (a TCP SYN:
// a second's retransmission timeout) was lost, and again whenever an idle
// entry aged out (15 minutes by default). Neighbors resolves the next hop
// towards a peer in the kernel (the transport addresses live on the
// transport bridge's internal port, so the kernel's ARP exchange passes
// through OVS and is snooped as well) and writes the result into OVS's
// cache with "tnl/neigh/set". Calling Ensure again refreshes the entry.
//
// The kernel (system) datapath uses the kernel's own neighbor table and
// needs none of this.
type Neighbors struct {
	// Bridge is the transport bridge whose cache is filled.
	Bridge string
	// Appctl reaches ovs-vswitchd.
	Appctl Appctl
	// Wait bounds how long Ensure waits for the kernel to confirm a next
	// hop; default 7 s: a STALE entry is confirmed only after the kernel's
	// delay_first_probe_time (5 s) and one unicast probe (ip-sysctl).
	Wait time.Duration
}

// Ensure makes OVS's tunnel neighbor cache hold the MAC of the next hop
// towards peer (peer itself when on-link, else its gateway), once the
// kernel has confirmed it (REACHABLE): a STALE entry may hold an old MAC,
// which must not overwrite a fresher one OVS snooped. Errors name the
// step: no route, no confirmation within Wait, or the appctl command.
func (n *Neighbors) Ensure(ctx context.Context, peer net.IP) error {
	hop, link, err := nextHop(peer)
	if err != nil {
		return err
	}
	mac, err := n.resolve(ctx, hop, link)
	if err != nil {
		return err
	}
	if _, err := n.Appctl.Run(ctx, "tnl/neigh/set", n.Bridge, hop.String(), mac.String()); err != nil {
		return fmt.Errorf("tnl/neigh/set %s %s %s: %w", n.Bridge, hop, mac, err)
	}
	return nil
}

// nextHop returns the address whose MAC the outer packet towards peer
// carries, and the index of the interface it leaves through.
func nextHop(peer net.IP) (net.IP, int, error) {
	routes, err := netlink.RouteGet(peer)
	if err != nil || len(routes) == 0 {
		return nil, 0, fmt.Errorf("route to tunnel peer %s: %w", peer, errors.Join(err, errNoRoute))
	}
	r := routes[0]
	if r.Gw != nil {
		return r.Gw, r.LinkIndex, nil
	}
	return peer, r.LinkIndex, nil
}

var errNoRoute = errors.New("no route")

// resolve asks the kernel to (re)confirm hop on link (a neighbor update
// with NTF_USE starts resolution as sending a packet would, rtnetlink(7))
// and waits until the entry is confirmed.
func (n *Neighbors) resolve(ctx context.Context, hop net.IP, link int) (net.HardwareAddr, error) {
	use := &netlink.Neigh{LinkIndex: link, Family: netlink.FAMILY_V4, IP: hop, Flags: netlink.NTF_USE}
	if err := netlink.NeighSet(use); err != nil {
		return nil, fmt.Errorf("starting neighbor resolution of %s: %w", hop, err)
	}
	wait := n.Wait
	if wait <= 0 {
		wait = 7 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		if mac := kernelMAC(hop, link); mac != nil {
			return mac, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("neighbor %s was not confirmed by ARP within %s", hop, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// kernelMAC returns the MAC of a confirmed kernel neighbor entry for hop.
func kernelMAC(hop net.IP, link int) net.HardwareAddr {
	neighs, err := netlink.NeighList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_PERMANENT | netlink.NUD_NOARP
	for _, e := range neighs {
		if e.IP.Equal(hop) && e.State&usable != 0 && len(e.HardwareAddr) == 6 {
			return e.HardwareAddr
		}
	}
	return nil
}

package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

// HostTable is the nftables table (family ip) holding the proxy's host
// rules:
//
//   - connections to Service frontends without endpoints are rejected in
//     the forward and input paths (OVS cannot build a TCP RST or an ICMP
//     error, so the bridge hands such packets to the host): TCP with a
//     reset, everything else with ICMP port unreachable; the host's own
//     connections to them are rejected as they leave (output), since a
//     packet from a local address that the bridge sent back would arrive
//     as a martian and be dropped;
//   - connections to a ClusterIP on a port its Service does not define (a
//     ClusterIP with a port not in SetServicePorts) are rejected the same
//     way, as kube-proxy does: in the forward path those from Pods (no
//     frontend matches them, so the bridge sends them on to the host) and
//     those the host forwards, as they leave those of the host. Not in
//     the input path: where kube-proxy runs beside Seine (proxyAll off) in
//     IPVS mode, ClusterIPs are local addresses whose traffic it serves
//     there;
//   - with proxyAll, NodePort traffic to the node-port addresses is DNATed
//     to pipeline.NodePortVIP (port unchanged) in prerouting and output,
//     which routes it into the bridge through the gateway;
//   - with proxyAll, connections the bridge SNATed to
//     pipeline.ServiceHostSNATIP are masqueraded when they leave the Node
//     (postrouting), and the host routes their replies back to the
//     gateway;
//   - with proxyAll, the host's own connections to an alias (below) are
//     SNATed to the Node IP as they enter the gateway (postrouting): they
//     come from the local address itself, which the bridge would not
//     know as the Node's;
//   - with proxyAll, traffic to an externalIP or LoadBalancer IP on one of
//     its Service ports (SetExternalPorts) while that IP is a local
//     address of the Node (kube-vip, keepalived, a Node address listed as
//     an externalIP) is DNATed to the IP's alias (MapLocalVIPAliases, port
//     unchanged) in prerouting and output: the host's local routing table
//     would deliver it to the host itself before any route to the
//     gateway, while the alias is routed into the bridge, whose external
//     frontends match it beside the IP. The check is made for each new
//     connection (`fib daddr type local`), so an address that moves
//     between Nodes is served wherever it is.
const HostTable = "seine-proxy"

// The sets of HostTable.
const (
	SetNoEndpoints       = "no-endpoints"       // ipv4_addr . inet_proto . inet_service
	SetClusterIPs        = "cluster-ips"        // ipv4_addr
	SetServicePorts      = "service-ports"      // ipv4_addr . inet_proto . inet_service
	SetNodePorts         = "nodeports"          // inet_proto . inet_service
	SetNodePortAddresses = "nodeport-addresses" // ipv4_addr, intervals
	SetExternalPorts     = "external-ports"     // ipv4_addr . inet_proto . inet_service
	MapLocalVIPAliases   = "local-vip-aliases"  // ipv4_addr : ipv4_addr
)

// routeProtocol marks the host routes the proxy owns (rtnetlink
// rtm_protocol; values above 4 are free for routing daemons, rtnetlink(7)).
const routeProtocol netlink.RouteProtocol = 0x5e

// element is one element of a HostTable set, or of a map when value is
// set (a map's element is identified by its key alone).
type element struct {
	set   string
	key   []string
	value []string
}

func (e element) id() string { return e.set + " " + strings.Join(e.key, " . ") }

// nft returns e as knftables writes it.
func (e element) nft() *knftables.Element {
	if e.value != nil {
		return &knftables.Element{Map: e.set, Key: e.key, Value: e.value}
	}
	return &knftables.Element{Set: e.set, Key: e.key}
}

func rejectElement(vip net.IP, proto uint8, port uint16) element {
	return element{set: SetNoEndpoints, key: []string{vip.String(), strconv.Itoa(int(proto)), strconv.Itoa(int(port))}}
}

func clusterIPElement(ip net.IP) element {
	return element{set: SetClusterIPs, key: []string{ip.String()}}
}

func nodePortElement(proto uint8, port uint16) element {
	return element{set: SetNodePorts, key: []string{strconv.Itoa(int(proto)), strconv.Itoa(int(port))}}
}

func externalPortElement(vip net.IP, proto uint8, port uint16) element {
	return element{set: SetExternalPorts, key: rejectElement(vip, proto, port).key}
}

func aliasElement(vip, alias net.IP) element {
	return element{set: MapLocalVIPAliases, key: []string{vip.String()}, value: []string{alias.String()}}
}

// hostConfig configures the host side of the proxy.
type hostConfig struct {
	proxyAll bool
	gateway  string     // the gateway interface
	services *net.IPNet // the ClusterIP range, routed to the gateway with proxyAll
	// nodePortAddresses are the local addresses (CIDRs) that accept
	// NodePort traffic.
	nodePortAddresses []*net.IPNet
	// routeSrc, when set, is the preferred source of the routes into the
	// gateway (a gateway without an address of its own).
	routeSrc net.IP
	// aliases is the range of the externalIPs' and LoadBalancer IPs'
	// aliases, routed from the host to the gateway
	// (pipeline.DefaultLocalVIPAliasCIDR when nil).
	aliases *net.IPNet
	// nodeSource, when set, is the source the host gives its own
	// connections to an alias: the Node IP, which the bridge counts as
	// the Node's, so that externalTrafficPolicy Local short-circuits them
	// as it does the Node's other connections, and
	// loadBalancerSourceRanges admit them when a range holds it.
	nodeSource net.IP
}

// host keeps the proxy's nftables elements and routes, reference counted
// (two frontends may need the same element or route). Not safe for
// concurrent use; the Proxier serialises calls.
type host struct {
	cfg      hostConfig
	nft      knftables.Interface
	elements map[string]int
	routes   map[string]int
	// dirtyElements and dirtyRoutes are those whose presence in the
	// kernel may not match their count (see flush).
	dirtyElements map[string]element
	dirtyRoutes   map[string]net.IP
	// aliases maps an externalIP or LoadBalancer IP to its alias in
	// cfg.aliases, and aliasOwner the other way; an alias is held from
	// its first use until its map element leaves the kernel. They are
	// read back from MapLocalVIPAliases at reset, so a restart keeps them
	// (the established connections' NAT names them).
	aliases    map[string]net.IP
	aliasOwner map[string]string
	nextAlias  uint32
	// pending are the IPs whose alias was handed out but whose map
	// element is not in the kernel yet (see sweepAliases).
	pending map[string]bool
	// staleCT is what the host's connection tracker may still hold NATed
	// to an alias that is gone or to a port no longer served through it,
	// for the Proxier to delete outside its lock (takeStaleConntrack,
	// deleteConntrack); quarantine holds the aliases given up whose
	// entries are not deleted yet, which aliasOf hands out to no one.
	staleCT    conntrackGone
	quarantine map[string]bool
	// ct deletes entries from the host's connection tracker (nil: none).
	ct conntrackDeleter
}

// conntrackDeleter deletes the entries of the host's connection tracker
// (the kernel's, in the daemon's network namespace) that match.
type conntrackDeleter interface {
	DeleteMatching(match func(*netlink.ConntrackFlow) bool) (uint, error)
}

// kernelConntrack is the kernel's IPv4 connection tracker, through
// netlink (conntrack(8)'s -D, one dump of the table per call).
type kernelConntrack struct{}

func (kernelConntrack) DeleteMatching(match func(*netlink.ConntrackFlow) bool) (uint, error) {
	return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, conntrackMatch(match))
}

// conntrackMatch adapts a function to netlink.CustomConntrackFilter.
type conntrackMatch func(*netlink.ConntrackFlow) bool

func (m conntrackMatch) MatchConntrackFlow(f *netlink.ConntrackFlow) bool { return m(f) }

// conntrackGone collects the host's conntrack entries to delete: those
// NATed to an alias given up (it may go to another IP next), and those of
// an IP . protocol . port no longer in SetExternalPorts (the bridge no
// longer balances them: a UDP flow would otherwise stay stuck on the
// alias for as long as it keeps sending).
type conntrackGone struct {
	aliases map[string]bool   // alias
	ports   map[string]net.IP // "ip/proto/port" of SetExternalPorts → the IP's alias
}

func (g *conntrackGone) empty() bool { return len(g.aliases) == 0 && len(g.ports) == 0 }

// match reports whether f is one of g's entries: its reply comes from one
// of the aliases, or it went to one of the ports and its reply comes from
// that IP's alias.
func (g *conntrackGone) match(f *netlink.ConntrackFlow) bool {
	if f.Zone != 0 { // the kernel datapath's OVS zones hold the bridge's own entries
		return false
	}
	src := f.Reverse.SrcIP.String()
	if g.aliases[src] {
		return true
	}
	if len(g.ports) == 0 {
		return false
	}
	alias, ok := g.ports[fmt.Sprintf("%s/%d/%d", f.Forward.DstIP, f.Forward.Protocol, f.Forward.DstPort)]
	return ok && alias.String() == src
}

func newHost(cfg hostConfig) (*host, error) {
	nft, err := knftables.New(knftables.IPv4Family, HostTable)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	h := newHostWith(cfg, nft)
	h.ct = kernelConntrack{}
	return h, nil
}

func newHostWith(cfg hostConfig, nft knftables.Interface) *host {
	if cfg.aliases == nil {
		_, cfg.aliases, _ = net.ParseCIDR(pipeline.DefaultLocalVIPAliasCIDR)
	}
	return &host{cfg: cfg, nft: nft, elements: map[string]int{}, routes: map[string]int{},
		dirtyElements: map[string]element{}, dirtyRoutes: map[string]net.IP{},
		aliases: map[string]net.IP{}, aliasOwner: map[string]string{}, pending: map[string]bool{},
		quarantine: map[string]bool{}}
}

// aliasOf returns vip's alias, taking a free one from cfg.aliases if vip
// has none yet; false when every alias is taken (vip is then served only
// while it is not a local address of the Node).
func (h *host) aliasOf(vip net.IP) (net.IP, bool) {
	if a, ok := h.aliases[vip.String()]; ok {
		return a, true
	}
	base := binary.BigEndian.Uint32(h.cfg.aliases.IP.To4())
	ones, bits := h.cfg.aliases.Mask.Size()
	size := uint32(1) << (bits - ones)
	if uint32(len(h.aliasOwner)+len(h.quarantine)) >= size-2 {
		return nil, false
	}
	// The range's first and last addresses are left out.
	for range size {
		h.nextAlias = h.nextAlias%(size-2) + 1
		a := make(net.IP, 4)
		binary.BigEndian.PutUint32(a, base+h.nextAlias)
		if _, taken := h.aliasOwner[a.String()]; !taken && !h.quarantine[a.String()] {
			h.holdAlias(vip, a)
			h.pending[vip.String()] = true
			return a, true
		}
	}
	return nil, false
}

func (h *host) holdAlias(vip, alias net.IP) {
	h.aliases[vip.String()] = alias
	h.aliasOwner[alias.String()] = vip.String()
}

// releaseAlias gives vip's alias up; the host's conntrack entries NATed
// to it are deleted at the next flush.
func (h *host) releaseAlias(vip string) {
	delete(h.pending, vip)
	if a, ok := h.aliases[vip]; ok {
		delete(h.aliasOwner, a.String())
		delete(h.aliases, vip)
		h.staleCTAlias(a)
	}
}

// staleCTAlias queues the host's conntrack entries NATed to alias for
// deletion and keeps the alias from being handed out until they are gone.
func (h *host) staleCTAlias(alias net.IP) {
	if h.staleCT.aliases == nil {
		h.staleCT.aliases = map[string]bool{}
	}
	h.staleCT.aliases[alias.String()] = true
	h.quarantine[alias.String()] = true
}

// sweepAliases gives up the aliases handed out (aliasOf) that never
// reached the kernel and that no installed frontend lists (named reports
// whether one does): what a frontend that failed before its host update
// and then went away left held.
func (h *host) sweepAliases(named func(alias net.IP) bool) {
	if h == nil {
		return
	}
	for vip := range h.pending {
		a, ok := h.aliases[vip]
		if !ok {
			delete(h.pending, vip)
			continue
		}
		if h.elements[aliasElement(net.ParseIP(vip), a).id()] == 0 && !named(a) {
			h.releaseAlias(vip)
		}
	}
}

// isAlias reports whether ip is in the aliases' range.
func (h *host) isAlias(ip net.IP) bool { return h.cfg.aliases.Contains(ip) }

// usable reports whether aliasOf could hand ip out: in the range, and
// neither its first nor its last address.
func (h *host) usable(ip net.IP) bool {
	ip4 := ip.To4()
	if ip4 == nil || !h.isAlias(ip4) {
		return false
	}
	ones, bits := h.cfg.aliases.Mask.Size()
	off := binary.BigEndian.Uint32(ip4) - binary.BigEndian.Uint32(h.cfg.aliases.IP.To4())
	return off != 0 && off != uint32(1)<<(bits-ones)-1
}

// reset (re)creates the table's chains and rules in one transaction
// without flushing the element sets, so traffic keeps flowing across a
// daemon restart; prune later removes what is no longer wanted. With
// proxyAll it also installs the routes and permanent neighbour entries of
// NodePortVIP and ServiceHostSNATIP on the gateway, the masquerade of
// ServiceHostSNATIP leaving through other interfaces, and the route of
// the ClusterIP range.
func (h *host) reset(ctx context.Context) error {
	tx := h.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: Service proxy host rules")})
	tx.Add(&knftables.Set{Name: SetNoEndpoints, Type: "ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("Service frontends without endpoints")})
	tx.Add(&knftables.Set{Name: SetClusterIPs, Type: "ipv4_addr",
		Comment: knftables.PtrTo("ClusterIPs of the Services seine proxies")})
	tx.Add(&knftables.Set{Name: SetServicePorts, Type: "ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("ClusterIP . protocol . port of every Service port seine proxies")})
	tx.Add(&knftables.Set{Name: SetNodePorts, Type: "inet_proto . inet_service",
		Comment: knftables.PtrTo("NodePorts handled by seine")})
	tx.Add(&knftables.Set{Name: SetNodePortAddresses, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag},
		Comment: knftables.PtrTo("local addresses accepting NodePort traffic")})
	tx.Add(&knftables.Set{Name: SetExternalPorts, Type: "ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("externalIP or LoadBalancer IP . protocol . port of every external frontend")})
	tx.Add(&knftables.Map{Name: MapLocalVIPAliases, Type: "ipv4_addr : ipv4_addr",
		Comment: knftables.PtrTo("externalIPs and LoadBalancer IPs to their aliases, routed into the bridge")})
	tx.Flush(&knftables.Set{Name: SetNodePortAddresses})
	for _, n := range h.cfg.nodePortAddresses {
		tx.Add(&knftables.Element{Set: SetNodePortAddresses, Key: []string{n.String()}})
	}
	type chain struct {
		name     string
		typ      knftables.BaseChainType
		hook     knftables.BaseChainHook
		priority knftables.BaseChainPriority
	}
	chains := []chain{
		{"forward", knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority + "-10"},
		{"input", knftables.FilterType, knftables.InputHook, knftables.FilterPriority + "-10"},
		{"output-filter", knftables.FilterType, knftables.OutputHook, knftables.FilterPriority + "-10"},
		{"prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority},
		{"output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority},
		{"postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority},
	}
	for _, c := range chains {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(c.typ), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(c.priority)})
		tx.Flush(&knftables.Chain{Name: c.name})
	}
	// New connections only, as kube-proxy rejects them: a Service whose
	// endpoints all went away for a moment must not reset the connections
	// that still reach the old ones. A connection the bridge hands back
	// for rejecting has seen no reply, so it is still new here.
	reject := func(chain string, match string, comment *string) {
		tx.Add(&knftables.Rule{Chain: chain, Rule: knftables.Concat("ct state new", match, "meta l4proto tcp reject with tcp reset"),
			Comment: comment})
		tx.Add(&knftables.Rule{Chain: chain, Rule: knftables.Concat("ct state new", match, "reject with icmp type port-unreachable"),
			Comment: comment})
	}
	for _, c := range chains[:3] {
		reject(c.name, "ip daddr . meta l4proto . th dport @"+SetNoEndpoints, nil)
	}
	undefined := knftables.PtrTo("a ClusterIP on a port its Service does not define")
	// The defined ports are left alone: traffic the host forwards into
	// the bridge (routed in from elsewhere, or from another network
	// namespace of the Node) crosses this hook before the bridge
	// balances it.
	undefinedPort := "ip daddr @" + SetClusterIPs + " ip daddr . meta l4proto . th dport != @" + SetServicePorts
	reject("forward", undefinedPort, undefined)
	reject("output-filter", undefinedPort, undefined)
	if h.cfg.proxyAll {
		// An externalIP or LoadBalancer IP goes before a NodePort on the
		// same address and port, as under kube-proxy. What the bridge
		// hands to the host (a connection to be rejected) keeps its
		// address.
		for _, c := range []struct{ name, match string }{
			{"prerouting", fmt.Sprintf("iifname != %q ", h.cfg.gateway)}, {"output", ""}} {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: c.match + knftables.Concat(
				"ip daddr . meta l4proto . th dport", "@"+SetExternalPorts, "fib daddr type local",
				"dnat to ip daddr map", "@"+MapLocalVIPAliases),
				Comment: knftables.PtrTo("an externalIP or LoadBalancer IP that is a local address, into the bridge")})
		}
		for _, c := range chains[3:5] {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: knftables.Concat(
				"ip daddr", "@"+SetNodePortAddresses, "fib daddr type local",
				"meta l4proto . th dport", "@"+SetNodePorts, "dnat to", pipeline.NodePortVIP.String()),
				Comment: knftables.PtrTo("NodePort into the bridge")})
		}
		tx.Add(&knftables.Rule{Chain: "postrouting", Rule: knftables.Concat(
			"ip saddr", pipeline.ServiceHostSNATIP.String(), "oifname !=", fmt.Sprintf("%q", h.cfg.gateway), "masquerade"),
			Comment: knftables.PtrTo("Service connections the bridge sends out through the host")})
		if h.cfg.nodeSource != nil {
			// A connection of the host's own to a local externalIP
			// comes from that IP, which the bridge does not know as
			// the Node's.
			tx.Add(&knftables.Rule{Chain: "postrouting", Rule: knftables.Concat(
				"oifname", fmt.Sprintf("%q", h.cfg.gateway), "ip daddr", h.cfg.aliases.String(),
				"fib saddr type local", "snat to", h.cfg.nodeSource.String()),
				Comment: knftables.PtrTo("the Node's own connections to its local externalIPs and LoadBalancer IPs, as the Node's")})
		}
	}
	if err := h.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("programming table %s: %w", HostTable, err)
	}
	if err := h.readAliases(ctx); err != nil {
		return err
	}
	if !h.cfg.proxyAll {
		return nil
	}
	link, err := netlink.LinkByName(h.cfg.gateway)
	if err != nil {
		return fmt.Errorf("gateway %s: %w", h.cfg.gateway, err)
	}
	for _, ip := range []net.IP{pipeline.NodePortVIP, pipeline.ServiceHostSNATIP} {
		dst := &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK,
			Src: h.cfg.routeSrc, Protocol: routeProtocol}); err != nil {
			return fmt.Errorf("route to %s: %w", dst, err)
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: ip, HardwareAddr: pipeline.VirtualMAC()}); err != nil {
			return fmt.Errorf("neighbour %s: %w", ip, err)
		}
	}
	for _, dst := range []*net.IPNet{h.cfg.services, h.cfg.aliases} {
		if dst == nil {
			continue
		}
		if err := h.replaceRoute(link, dst); err != nil {
			return err
		}
	}
	return nil
}

// readAliases takes back the aliases an earlier run left in
// MapLocalVIPAliases (prune drops those no frontend wants).
func (h *host) readAliases(ctx context.Context) error {
	els, err := h.nft.ListElements(ctx, "map", MapLocalVIPAliases)
	if err != nil {
		return fmt.Errorf("listing map %s: %w", MapLocalVIPAliases, err)
	}
	// An element this daemon would not write (an alias outside the range,
	// or one another IP has) goes: adding the IP's own alias later would
	// fail while the kernel holds another value for it.
	tx := h.nft.NewTransaction()
	base := binary.BigEndian.Uint32(h.cfg.aliases.IP.To4())
	var foreign []net.IP
	for _, el := range els {
		var vip, alias net.IP
		if len(el.Key) == 1 && len(el.Value) == 1 {
			vip, alias = net.ParseIP(el.Key[0]).To4(), net.ParseIP(el.Value[0]).To4()
		}
		if vip != nil && alias != nil && h.usable(alias) {
			if a, has := h.aliases[vip.String()]; has && a.Equal(alias) {
				continue
			} else if _, taken := h.aliasOwner[alias.String()]; !has && !taken {
				h.holdAlias(vip, alias)
				// Hand out new aliases after the ones taken back, so
				// that none freed just now is reused at once.
				h.nextAlias = max(h.nextAlias, binary.BigEndian.Uint32(alias)-base)
				continue
			}
		}
		tx.Delete(&knftables.Element{Map: MapLocalVIPAliases, Key: el.Key})
		if alias != nil {
			foreign = append(foreign, alias)
		}
	}
	if tx.NumOperations() > 0 {
		if err := h.nft.Run(ctx, tx); err != nil {
			return fmt.Errorf("deleting foreign elements of map %s: %w", MapLocalVIPAliases, err)
		}
	}
	// What the host NATed to a foreign element's alias goes with it,
	// unless another IP holds that alias now.
	for _, a := range foreign {
		if _, held := h.aliasOwner[a.String()]; !held {
			h.staleCTAlias(a)
		}
	}
	return nil
}

func (h *host) replaceRoute(link netlink.Link, dst *net.IPNet) error {
	err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: pipeline.NodePortVIP,
		Flags: int(netlink.FLAG_ONLINK), Src: h.cfg.routeSrc, Protocol: routeProtocol})
	if err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, pipeline.NodePortVIP, err)
	}
	return nil
}

// update applies reference count changes: an element or a route (an IPv4
// address routed to the gateway) whose count goes from 0 to 1 is added,
// one whose count drops to 0 removed. The counts always take the change,
// so the caller records what it now wants even when update fails: what
// could not be made to match its count stays dirty, and this call and
// every later one try it again (flush), so the caller's retry of a failed
// update need not repeat it. The error names only the elements and routes
// of this call: another frontend's, retried here, fail its own updates.
func (h *host) update(ctx context.Context, addEl, delEl []element, addRoutes, delRoutes []net.IP) error {
	if h == nil { // tests and benchmarks of the datapath side only
		return nil
	}
	mine := map[string]bool{}
	for _, e := range addEl {
		mine[e.id()] = true
		if countChange(h.elements, e.id(), 1) == 1 {
			h.dirtyElements[e.id()] = e
		}
	}
	for _, e := range delEl {
		mine[e.id()] = true
		if countChange(h.elements, e.id(), -1) == 0 {
			h.dirtyElements[e.id()] = e
		}
	}
	for _, ip := range addRoutes {
		mine[ip.String()] = true
		if countChange(h.routes, ip.String(), 1) == 1 {
			h.dirtyRoutes[ip.String()] = ip
		}
	}
	for _, ip := range delRoutes {
		mine[ip.String()] = true
		if countChange(h.routes, ip.String(), -1) == 0 {
			h.dirtyRoutes[ip.String()] = ip
		}
	}
	var errs []error
	for k, err := range h.flush(ctx) {
		if mine[k] {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// countChange adds d to m[k] and returns the new count, below 0 for the
// removal of something never added; a count at 0 or below leaves the map.
func countChange(m map[string]int, k string, d int) int {
	n := m[k] + d
	if n <= 0 {
		delete(m, k)
		return n
	}
	m[k] = n
	return n
}

// flush makes every dirty element and route match its count: present when
// counted, absent when not. What fails stays dirty; the failures are
// returned by element id or route address. The elements go in one
// transaction, or, when the kernel refuses it, one transaction each, so
// that one refused element does not hold back the others.
func (h *host) flush(ctx context.Context) map[string]error {
	failed := map[string]error{}
	if len(h.dirtyElements) > 0 {
		put := func(tx *knftables.Transaction, id string, e element) {
			tx.Add(e.nft()) // so that a delete cannot fail
			if h.elements[id] == 0 {
				tx.Delete(e.nft())
			}
		}
		done := func(id string, e element) {
			delete(h.dirtyElements, id)
			switch {
			case e.set == MapLocalVIPAliases && h.elements[id] == 0:
				h.releaseAlias(e.key[0])
			case e.set == MapLocalVIPAliases:
				delete(h.pending, e.key[0])
			case e.set == SetExternalPorts && h.elements[id] == 0:
				h.staleCTPort(e.key)
			case e.set == SetExternalPorts:
				// Served again before its entries went: they are live.
				delete(h.staleCT.ports, strings.Join(e.key, "/"))
			}
		}
		tx := h.nft.NewTransaction()
		for id, e := range h.dirtyElements {
			put(tx, id, e)
		}
		if err := h.nft.Run(ctx, tx); err == nil {
			for id, e := range h.dirtyElements {
				done(id, e)
			}
		} else {
			for id, e := range h.dirtyElements {
				one := h.nft.NewTransaction()
				put(one, id, e)
				if err := h.nft.Run(ctx, one); err != nil {
					failed[id] = fmt.Errorf("updating table %s, element %s: %w", HostTable, id, err)
					continue
				}
				done(id, e)
			}
		}
	}
	if len(h.dirtyRoutes) > 0 {
		link, err := netlink.LinkByName(h.cfg.gateway)
		for k, ip := range h.dirtyRoutes {
			if err != nil {
				failed[k] = fmt.Errorf("gateway %s: %w", h.cfg.gateway, err)
				continue
			}
			dst := &net.IPNet{IP: ip.To4(), Mask: net.CIDRMask(32, 32)}
			var rerr error
			if h.routes[k] > 0 {
				rerr = h.replaceRoute(link, dst)
			} else if derr := netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst,
				Gw: pipeline.NodePortVIP}); derr != nil && !errors.Is(derr, syscall.ESRCH) {
				rerr = fmt.Errorf("deleting route to %s: %w", ip, derr)
			}
			if rerr != nil {
				failed[k] = rerr
				continue
			}
			delete(h.dirtyRoutes, k)
		}
	}
	return failed
}

// staleCTPort queues the host's conntrack entries of an
// SetExternalPorts element (ip, protocol, port) that went, if its IP has
// an alias, for deleteStaleConntrack.
func (h *host) staleCTPort(key []string) {
	a, ok := h.aliases[key[0]]
	if !ok || len(key) != 3 {
		return
	}
	if h.staleCT.ports == nil {
		h.staleCT.ports = map[string]net.IP{}
	}
	h.staleCT.ports[strings.Join(key, "/")] = a
}

// takeStaleConntrack hands over what staleCT holds, for deleteConntrack
// outside the Proxier's lock, and empties it.
func (h *host) takeStaleConntrack() conntrackGone {
	if h == nil {
		return conntrackGone{}
	}
	g := h.staleCT
	h.staleCT = conntrackGone{}
	return g
}

// deleteConntrack deletes the host's conntrack entries g names, in one
// pass over the table (seconds on a busy Node: call it without the
// Proxier's lock; it reads only h.ct, fixed at creation).
func (h *host) deleteConntrack(g conntrackGone) (uint, error) {
	if h.ct == nil || g.empty() {
		return 0, nil
	}
	return h.ct.DeleteMatching(g.match)
}

// conntrackDeleted ends g's turn: on success its aliases leave quarantine;
// on failure (an interrupted dump of a busy table) g goes back into
// staleCT, for the next batch to try again. The entries otherwise live out
// their timeouts.
func (h *host) conntrackDeleted(g conntrackGone, err error) {
	if err == nil {
		for a := range g.aliases {
			delete(h.quarantine, a)
		}
		return
	}
	for a := range g.aliases {
		if h.staleCT.aliases == nil {
			h.staleCT.aliases = map[string]bool{}
		}
		h.staleCT.aliases[a] = true
	}
	for k, a := range g.ports {
		// A port served again meanwhile has live entries now.
		if h.elements[SetExternalPorts+" "+strings.ReplaceAll(k, "/", " . ")] > 0 {
			continue
		}
		if h.staleCT.ports == nil {
			h.staleCT.ports = map[string]net.IP{}
		}
		h.staleCT.ports[k] = a
	}
}

// prune removes the elements and routes left by an earlier run that no
// frontend wants now. Call it once every known Service is programmed.
func (h *host) prune(ctx context.Context) error {
	if h == nil {
		return nil
	}
	tx := h.nft.NewTransaction()
	var goneAliases []string
	for _, set := range []string{SetNoEndpoints, SetClusterIPs, SetServicePorts, SetNodePorts, SetExternalPorts, MapLocalVIPAliases} {
		typ := "set"
		if set == MapLocalVIPAliases {
			typ = "map"
		}
		els, err := h.nft.ListElements(ctx, typ, set)
		if err != nil {
			return fmt.Errorf("listing %s %s: %w", typ, set, err)
		}
		for _, el := range els {
			if h.elements[element{set: set, key: canonicalKey(el.Key)}.id()] > 0 {
				continue
			}
			switch {
			case typ == "map":
				tx.Delete(&knftables.Element{Map: set, Key: el.Key})
				goneAliases = append(goneAliases, el.Key[0])
			case set == SetExternalPorts:
				tx.Delete(&knftables.Element{Set: set, Key: el.Key})
				h.staleCTPort(canonicalKey(el.Key))
			default:
				tx.Delete(&knftables.Element{Set: set, Key: el.Key})
			}
		}
	}
	if tx.NumOperations() > 0 {
		if err := h.nft.Run(ctx, tx); err != nil {
			return fmt.Errorf("pruning table %s: %w", HostTable, err)
		}
	}
	for _, vip := range goneAliases {
		h.releaseAlias(vip)
	}
	link, err := netlink.LinkByName(h.cfg.gateway)
	if err != nil {
		return fmt.Errorf("gateway %s: %w", h.cfg.gateway, err)
	}
	routes, err := proxyRoutes(link)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.Dst == nil || r.Gw == nil || !r.Gw.Equal(pipeline.NodePortVIP) {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		keep := h.routes[r.Dst.IP.String()] > 0 && ones == 32 ||
			h.cfg.proxyAll && h.cfg.services != nil && r.Dst.String() == h.cfg.services.String() ||
			h.cfg.proxyAll && r.Dst.String() == h.cfg.aliases.String()
		if !keep {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("deleting stale route to %s: %w", r.Dst, err)
			}
		}
	}
	return nil
}

// canonicalKey turns protocol names, as nft lists inet_proto values, back
// into the numbers the proxy writes.
func canonicalKey(key []string) []string {
	out := make([]string, len(key))
	for i, k := range key {
		switch k {
		case "tcp":
			k = "6"
		case "udp":
			k = "17"
		case "sctp":
			k = "132"
		}
		out[i] = k
	}
	return out
}

// proxyRoutes lists the proxy's routes (protocol routeProtocol) on link.
func proxyRoutes(link netlink.Link) ([]netlink.Route, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: link.Attrs().Index,
		Protocol: routeProtocol}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("listing routes of %s: %w", link.Attrs().Name, err)
	}
	return routes, nil
}

// Cleanup removes what a Proxier leaves behind — HostTable, its routes and
// the neighbour entries of NodePortVIP and ServiceHostSNATIP on gateway,
// and the bridge's groups —
// for a Node whose proxy has been turned off. Missing pieces are fine.
func Cleanup(ctx context.Context, gateway string, sw Switch) error {
	var errs []error
	nft, err := knftables.New(knftables.IPv4Family, HostTable)
	if err == nil {
		err = nftables.DeleteTable(ctx, nft)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("deleting table %s: %w", HostTable, err))
	}
	if link, err := netlink.LinkByName(gateway); err == nil {
		routes, err := proxyRoutes(link)
		if err != nil {
			errs = append(errs, err)
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("deleting route to %s: %w", r.Dst, err))
			}
		}
		for _, ip := range []net.IP{pipeline.NodePortVIP, pipeline.ServiceHostSNATIP} {
			err = netlink.NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip})
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting neighbour %s: %w", ip, err))
			}
		}
	}
	ids, err := sw.GroupIDs(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	var mods []of.GroupMod
	for _, id := range ids {
		mods = append(mods, of.GroupMod{Op: of.GroupOpDelete, Group: of.GroupEntry{ID: id}})
	}
	return errors.Join(append(errs, sw.ApplyGroups(ctx, mods))...)
}

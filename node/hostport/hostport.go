// Package hostport serves a Pod's hostPorts: the CNI "portMappings"
// capability (CNI conventions, "Port mappings"), which kubelet's runtime
// fills from the containers' hostPort fields. The daemon does it itself
// instead of chaining the portmap plugin, so an ADD of a Pod without
// hostPorts costs nothing here, and one with hostPorts one nftables
// transaction instead of another process.
//
// The rules live in their own table (family ip), written once by Start;
// each mapping is one element of a map and one of a set, so ADD and DEL
// only add and delete elements:
//
//	table ip seine-hostport {
//	  map ports    { type inet_proto . inet_service : ipv4_addr . inet_service }             # hostIP unset
//	  map ip-ports { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service } # hostIP set
//	  set targets  { type ipv4_addr . inet_proto . inet_service }                            # Pod IP . proto . containerPort
//	  set self     { type ipv4_addr . ipv4_addr }                                            # Pod IP . Pod IP
//	  chain hostports {
//	    dnat ip to ip daddr . meta l4proto . th dport map @ip-ports
//	    dnat ip to meta l4proto . th dport map @ports
//	  }
//	  chain prerouting  { type nat hook prerouting priority dstnat; fib daddr type local jump hostports }
//	  chain output      { type nat hook output priority dstnat; fib daddr type local jump hostports }
//	  chain postrouting {
//	    type nat hook postrouting priority srcnat
//	    oifname "<gateway>" ip saddr 127.0.0.0/8 ct status dnat ip daddr . meta l4proto . th dport @targets masquerade
//	    oifname "<gateway>" ct status dnat ip saddr . ip daddr @self ip daddr . meta l4proto . th dport @targets masquerade
//	  }
//	  chain localnet-guard {
//	    type filter hook prerouting priority mangle
//	    iifname "<gateway>" ip daddr 127.0.0.0/8 drop
//	  }
//	}
//
// Only connections to a local address are mapped: a hostIP that is not
// one of the Node's addresses maps nothing (Kubernetes does not check it,
// and it must not take over traffic the Node forwards elsewhere).
//
// Every client but two keeps its source address, so the target Pod's
// NetworkPolicies judge the real client: another Pod (on this Node or
// another) as that Pod, a host outside the cluster as itself. The replies
// still pass the host's conntrack, which must undo the DNAT: the bridge
// sends the replies of every connection that entered from the gateway back
// to it (pipeline.CtMarkFromGateway). The two masqueraded to the gateway's
// address, and so never subject to the Pod's ingress policy (traffic from
// the Pod's own Node), are connections from 127.0.0.0/8, whose replies
// could not be routed, and a Pod reaching its own hostPort, whose kernel
// would drop a packet from its own address arriving from outside. Both
// apply only to connections DNATed to a hostPort's target. Connections
// from 127.0.0.1 need route_localnet on the gateway, which Start sets; the
// guard chain then drops what arrives from the bridge for 127.0.0.0/8 (a
// Pod could otherwise reach the host's loopback-only services,
// CVE-2020-8558). It runs before NAT (mangle, -150), where the replies of
// those connections still carry the gateway's address.
//
// Each element's comment is its owner (a Pod attachment,
// "pod/<containerID>/<ifName>"), so a restarted daemon learns the
// mappings from the table itself.
package hostport

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
)

// TableName is the nftables table (family ip) the Mapper owns.
const TableName = "seine-hostport"

const (
	mapPorts         = "ports"
	mapIPPorts       = "ip-ports"
	setTargets       = "targets"
	setSelf          = "self"
	chainDNAT        = "hostports"
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
	chainGuard       = "localnet-guard"
)

// Mapping is one entry of the portMappings capability: connections to
// HostPort (on HostIP, or on any local address when HostIP is empty) go
// to the Pod's ContainerPort.
type Mapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"` // "tcp", "udp" or "sctp"; empty means tcp
	HostIP        string `json:"hostIP,omitempty"`
}

// String returns "tcp 0.0.0.0:8080 -> 80".
func (m Mapping) String() string {
	ip := m.HostIP
	if ip == "" {
		ip = "0.0.0.0"
	}
	return fmt.Sprintf("%s %s -> %d", m.Protocol, net.JoinHostPort(ip, strconv.Itoa(m.HostPort)), m.ContainerPort)
}

// Parse decodes and validates a portMappings runtimeConfig value (a JSON
// array; nil or empty gives none). Protocols are lower-cased, an empty one
// becomes "tcp", a hostIP of 0.0.0.0 becomes empty, and entries with an
// IPv6 hostIP are skipped (Seine's Pods are IPv4). Errors name the
// offending entry: a port outside 1-65535, an unknown protocol, a hostIP
// that is not an IP address, or two entries for the same host port.
func Parse(raw json.RawMessage) ([]Mapping, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var in []Mapping
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("portMappings: %w", err)
	}
	out := make([]Mapping, 0, len(in))
	seen := map[hostKey]bool{}
	for i, m := range in {
		m.Protocol = strings.ToLower(m.Protocol)
		if m.Protocol == "" {
			m.Protocol = "tcp"
		}
		switch m.Protocol {
		case "tcp", "udp", "sctp":
		default:
			return nil, fmt.Errorf("portMappings[%d]: protocol %q is not tcp, udp or sctp", i, m.Protocol)
		}
		if m.HostPort < 1 || m.HostPort > 65535 || m.ContainerPort < 1 || m.ContainerPort > 65535 {
			return nil, fmt.Errorf("portMappings[%d]: hostPort %d and containerPort %d must be in 1-65535", i, m.HostPort, m.ContainerPort)
		}
		if m.HostIP != "" {
			ip := net.ParseIP(m.HostIP)
			switch {
			case ip == nil:
				return nil, fmt.Errorf("portMappings[%d]: hostIP %q is not an IP address", i, m.HostIP)
			case ip.To4() == nil:
				continue
			case ip.IsUnspecified():
				m.HostIP = ""
			default:
				m.HostIP = ip.To4().String()
			}
		}
		k := m.key()
		if seen[k] {
			return nil, fmt.Errorf("portMappings[%d]: %s is listed twice", i, m)
		}
		seen[k] = true
		out = append(out, m)
	}
	return out, nil
}

// hostKey identifies the host side of a mapping; ip is empty for every
// local address.
type hostKey struct {
	ip, proto string
	port      int
}

func (m Mapping) key() hostKey { return hostKey{m.HostIP, m.Protocol, m.HostPort} }

// keyOf returns the hostKey of an element of mapPorts or mapIPPorts.
func keyOf(e *knftables.Element) (hostKey, bool) {
	var k hostKey
	key := e.Key
	switch {
	case e.Map == mapIPPorts && len(key) == 3:
		k.ip, key = key[0], key[1:]
	case e.Map == mapPorts && len(key) == 2:
	default:
		return k, false
	}
	port, err := strconv.Atoi(key[1])
	k.proto, k.port = key[0], port
	return k, err == nil
}

// conflicts reports whether a and b claim the same connections: the same
// protocol and port, on the same address or one of them on every address
// (kube-scheduler's rule for hostPorts).
func (a hostKey) conflicts(b hostKey) bool {
	return a.proto == b.proto && a.port == b.port && (a.ip == b.ip || a.ip == "" || b.ip == "")
}

// elements realise m for a Pod at podIP: its map element and its target.
func (m Mapping) elements(podIP net.IP, owner string) (mapEl, target *knftables.Element) {
	mapEl = &knftables.Element{
		Map:     mapPorts,
		Key:     []string{m.Protocol, strconv.Itoa(m.HostPort)},
		Value:   []string{podIP.String(), strconv.Itoa(m.ContainerPort)},
		Comment: knftables.PtrTo(owner),
	}
	if m.HostIP != "" {
		mapEl.Map = mapIPPorts
		mapEl.Key = append([]string{m.HostIP}, mapEl.Key...)
	}
	target = &knftables.Element{
		Set:     setTargets,
		Key:     []string{podIP.String(), m.Protocol, strconv.Itoa(m.ContainerPort)},
		Comment: knftables.PtrTo(owner),
	}
	return mapEl, target
}

// selfElement is the element of setSelf of the Pod at podIP: a connection
// from it to one of its own hostPorts.
func selfElement(podIP net.IP, owner string) *knftables.Element {
	return &knftables.Element{Set: setSelf, Key: []string{podIP.String(), podIP.String()}, Comment: knftables.PtrTo(owner)}
}

// onlySelf reports whether els are setSelf elements alone: an owner with
// no mapping.
func onlySelf(els []*knftables.Element) bool {
	for _, e := range els {
		if e.Set != setSelf {
			return false
		}
	}
	return len(els) > 0
}

// missingSelf returns the setSelf element an owner's elements lack (from
// its first target's Pod IP), or nil when it has one or no target.
func missingSelf(owner string, els []*knftables.Element) *knftables.Element {
	var podIP net.IP
	for _, e := range els {
		switch {
		case e.Set == setSelf:
			return nil
		case e.Set == setTargets && podIP == nil && len(e.Key) > 0:
			podIP = net.ParseIP(e.Key[0]).To4()
		}
	}
	if podIP == nil {
		return nil
	}
	return selfElement(podIP, owner)
}

// Config says where the Pods are.
type Config struct {
	// Gateway is the gateway interface, through which the host reaches
	// the Pods.
	Gateway string
	// ProcSys is the root of the sysctl tree; default /proc/sys.
	ProcSys string
}

// Mapper keeps the host port mappings of this Node's Pods. It is safe for
// concurrent use; ADDs of different Pods each run one transaction.
type Mapper struct {
	nft knftables.Interface
	cfg Config

	mu     sync.Mutex
	owners map[string][]*knftables.Element // owner → its map and set elements
	taken  map[hostKey]string              // host side → owner
}

// New returns a Mapper writing TableName through nft (a knftables handle
// for TableName, family ip). Call Start before anything else.
func New(nft knftables.Interface, cfg Config) *Mapper {
	if cfg.ProcSys == "" {
		cfg.ProcSys = "/proc/sys"
	}
	return &Mapper{nft: nft, cfg: cfg, owners: map[string][]*knftables.Element{}, taken: map[hostKey]string{}}
}

// NewNFTables returns the knftables handle for TableName.
func NewNFTables() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.IPv4Family, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return nft, nil
}

// Start writes the table's chains, maps and set (keeping the elements
// already there, so established hostPort connections survive a daemon
// restart), reads those elements back as the current mappings, and sets
// route_localnet on the gateway.
func (m *Mapper) Start(ctx context.Context) error {
	gw := fmt.Sprintf("%q", m.cfg.Gateway)
	tx := m.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: Pod hostPorts")})
	tx.Add(&knftables.Map{Name: mapPorts, Type: "inet_proto . inet_service : ipv4_addr . inet_service",
		Comment: knftables.PtrTo("hostPorts on every local address")})
	tx.Add(&knftables.Map{Name: mapIPPorts, Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service",
		Comment: knftables.PtrTo("hostPorts on one hostIP")})
	tx.Add(&knftables.Set{Name: setTargets, Type: "ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("Pod IP . protocol . containerPort of every hostPort")})
	tx.Add(&knftables.Set{Name: setSelf, Type: "ipv4_addr . ipv4_addr",
		Comment: knftables.PtrTo("Pod IP . Pod IP of every Pod with hostPorts (hairpin)")})
	tx.Add(&knftables.Chain{Name: chainDNAT})
	tx.Flush(&knftables.Chain{Name: chainDNAT})
	tx.Add(&knftables.Rule{Chain: chainDNAT, Rule: "dnat ip to ip daddr . meta l4proto . th dport map @" + mapIPPorts})
	tx.Add(&knftables.Rule{Chain: chainDNAT, Rule: "dnat ip to meta l4proto . th dport map @" + mapPorts})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{chainPrerouting, knftables.PreroutingHook}, {chainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(knftables.DNATPriority)})
		tx.Flush(&knftables.Chain{Name: c.name})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: "fib daddr type local jump " + chainDNAT})
	}
	tx.Add(&knftables.Chain{Name: chainPostrouting, Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)})
	tx.Flush(&knftables.Chain{Name: chainPostrouting})
	tx.Add(&knftables.Rule{Chain: chainPostrouting, Rule: knftables.Concat(
		"oifname", gw, "ip saddr 127.0.0.0/8 ct status dnat",
		"ip daddr . meta l4proto . th dport @"+setTargets, "masquerade"),
		Comment: knftables.PtrTo("localhost reaching a hostPort: its replies could not be routed")})
	tx.Add(&knftables.Rule{Chain: chainPostrouting, Rule: knftables.Concat(
		"oifname", gw, "ct status dnat ip saddr . ip daddr @"+setSelf,
		"ip daddr . meta l4proto . th dport @"+setTargets, "masquerade"),
		Comment: knftables.PtrTo("a Pod reaching its own hostPort: it drops packets from its own address")})
	tx.Add(&knftables.Chain{Name: chainGuard, Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.ManglePriority)})
	tx.Flush(&knftables.Chain{Name: chainGuard})
	tx.Add(&knftables.Rule{Chain: chainGuard, Rule: knftables.Concat("iifname", gw, "ip daddr 127.0.0.0/8 drop"),
		Comment: knftables.PtrTo("route_localnet is on for hostPorts: keep Pods off the host's loopback")})
	if err := m.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("programming hostPort table: %w", err)
	}

	owners := map[string][]*knftables.Element{}
	taken := map[hostKey]string{}
	for _, o := range []struct{ kind, name string }{{"map", mapPorts}, {"map", mapIPPorts}, {"set", setTargets}, {"set", setSelf}} {
		els, err := m.nft.ListElements(ctx, o.kind, o.name)
		if err != nil {
			return fmt.Errorf("reading hostPort %s %s: %w", o.kind, o.name, err)
		}
		for _, e := range els {
			owner := ""
			if e.Comment != nil {
				owner = *e.Comment
			}
			if o.kind == "map" {
				e.Map = o.name
				if k, ok := keyOf(e); ok {
					taken[k] = owner
				}
			} else {
				e.Set = o.name
			}
			owners[owner] = append(owners[owner], e)
		}
	}
	// A setSelf element whose owner has no mapping left is stale (an
	// older daemon's DEL did not know the set), and its key may be a new
	// Pod's: it goes first. Then mappings written before setSelf existed
	// get their element.
	tx = m.nft.NewTransaction()
	for owner, els := range owners {
		if stale := onlySelf(els); stale {
			for _, e := range els {
				tx.Delete(e)
			}
			delete(owners, owner)
		}
	}
	for owner, els := range owners {
		if el := missingSelf(owner, els); el != nil {
			tx.Add(el)
			owners[owner] = append(els, el)
		}
	}
	if tx.NumOperations() > 0 {
		if err := m.nft.Run(ctx, tx); err != nil {
			return fmt.Errorf("adding hostPort hairpin elements: %w", err)
		}
	}
	m.mu.Lock()
	m.owners, m.taken = owners, taken
	m.mu.Unlock()

	p := filepath.Join(m.cfg.ProcSys, "net/ipv4/conf", m.cfg.Gateway, "route_localnet")
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("allowing connections from 127.0.0.1 to hostPorts: %w", err)
	}
	return nil
}

// Map gives owner exactly the mappings to the Pod at podIP, in one
// transaction (a repeated ADD replaces its earlier ones). A host port
// that another owner holds (the same protocol and port, on the same
// address or either on every address) is refused with an error naming it.
func (m *Mapper) Map(ctx context.Context, owner string, podIP net.IP, mappings []Mapping) error {
	if len(mappings) == 0 {
		return nil
	}
	if podIP.To4() == nil {
		return fmt.Errorf("hostPorts need an IPv4 Pod address, got %s", podIP)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mp := range mappings {
		for k, o := range m.taken {
			if o != owner && k.conflicts(mp.key()) {
				return fmt.Errorf("hostPort %s is already mapped to attachment %s", mp, o)
			}
		}
	}
	els := []*knftables.Element{selfElement(podIP.To4(), owner)}
	targets := map[string]bool{}
	for _, mp := range mappings {
		mapEl, target := mp.elements(podIP.To4(), owner)
		els = append(els, mapEl)
		if t := strings.Join(target.Key, " "); !targets[t] {
			targets[t] = true
			els = append(els, target)
		}
	}
	tx := m.nft.NewTransaction()
	for _, e := range m.owners[owner] {
		tx.Delete(e)
	}
	for _, e := range els {
		tx.Add(e)
	}
	err := m.nft.Run(ctx, tx)
	if knftables.IsNotFound(err) {
		// One of the old elements is gone: delete the rest one by one,
		// then add.
		if err = m.deleteLocked(ctx, owner); err == nil {
			tx = m.nft.NewTransaction()
			for _, e := range els {
				tx.Add(e)
			}
			err = m.nft.Run(ctx, tx)
		}
	}
	if err != nil {
		return fmt.Errorf("mapping hostPorts: %w", err)
	}
	m.forgetLocked(owner)
	m.owners[owner] = els
	for _, mp := range mappings {
		m.taken[mp.key()] = owner
	}
	return nil
}

// Unmap removes owner's mappings; an owner without any costs nothing.
func (m *Mapper) Unmap(ctx context.Context, owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deleteLocked(ctx, owner)
}

// deleteLocked deletes owner's elements and forgets them.
func (m *Mapper) deleteLocked(ctx context.Context, owner string) error {
	els := m.owners[owner]
	if len(els) == 0 {
		return nil
	}
	tx := m.nft.NewTransaction()
	for _, e := range els {
		tx.Delete(e)
	}
	err := m.nft.Run(ctx, tx)
	if knftables.IsNotFound(err) {
		// Someone removed one of them: the transaction did nothing, so
		// delete the others one by one.
		err = nil
		for _, e := range els {
			one := m.nft.NewTransaction()
			one.Delete(e)
			if rerr := m.nft.Run(ctx, one); rerr != nil && !knftables.IsNotFound(rerr) {
				err = rerr
			}
		}
	}
	if err != nil {
		return fmt.Errorf("removing hostPorts of %s: %w", owner, err)
	}
	m.forgetLocked(owner)
	return nil
}

func (m *Mapper) forgetLocked(owner string) {
	for k, o := range m.taken {
		if o == owner {
			delete(m.taken, k)
		}
	}
	delete(m.owners, owner)
}

// Owners lists the owners that have mappings, sorted.
func (m *Mapper) Owners() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.owners))
	for o := range m.owners {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

// Cleanup deletes the table (seine's uninstall).
func Cleanup(ctx context.Context, nft knftables.Interface) error {
	if err := nftables.DeleteTable(ctx, nft); err != nil {
		return fmt.Errorf("removing hostPort table: %w", err)
	}
	return nil
}

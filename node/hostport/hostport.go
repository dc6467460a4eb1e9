// Package hostport serves a Pod's hostPorts: the CNI "portMappings"
// capability (CNI conventions, "Port mappings"), which kubelet's runtime
// fills from the containers' hostPort fields. The daemon does it itself
// instead of chaining the portmap plugin, so an ADD of a Pod without
// hostPorts costs nothing here, and one with hostPorts one nftables
// transaction instead of another process.
//
// The rules live in their own table (family ip), written once by Start;
// each mapping is one element of a map, so ADD and DEL only add and delete
// elements:
//
//	table ip seine-hostport {
//	  map ports    { type inet_proto . inet_service : ipv4_addr . inet_service }             # hostIP unset
//	  map ip-ports { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service } # hostIP set
//	  chain hostports {
//	    dnat ip to ip daddr . meta l4proto . th dport map @ip-ports
//	    fib daddr type local dnat ip to meta l4proto . th dport map @ports
//	  }
//	  chain prerouting  { type nat hook prerouting priority dstnat; jump hostports }
//	  chain output      { type nat hook output priority dstnat; jump hostports }
//	  chain postrouting {
//	    type nat hook postrouting priority srcnat
//	    oifname "<gateway>" ip daddr <podCIDR> ip saddr { <clusterCIDR>, 127.0.0.0/8 } ct status dnat masquerade
//	  }
//	}
//
// The masquerade keeps both directions of a connection on the host: a
// Pod's reply to another Pod (on this Node or across a tunnel) would
// otherwise go straight through the bridge, past the host's conntrack
// that must undo the DNAT. Clients outside the cluster keep their source
// address. Connections from 127.0.0.1 need route_localnet on the gateway,
// which Start sets.
//
// Each element's comment is its owner (a Pod attachment,
// "<containerID>/<ifName>"), so a restarted daemon learns the mappings from
// the table itself.
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
)

// TableName is the nftables table (family ip) the Mapper owns.
const TableName = "seine-hostport"

const (
	mapPorts         = "ports"
	mapIPPorts       = "ip-ports"
	chainDNAT        = "hostports"
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
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
// becomes "tcp", and a hostIP of 0.0.0.0 becomes empty. Errors name the
// offending entry: a port outside 1-65535, an unknown protocol, a hostIP
// that is not IPv4 (IPv6 mappings are skipped: Seine's Pods are IPv4), or
// two entries for the same host port.
func Parse(raw json.RawMessage) ([]Mapping, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var in []Mapping
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("portMappings: %w", err)
	}
	out := make([]Mapping, 0, len(in))
	seen := map[string]bool{}
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

// key identifies the host side of a mapping: "[hostIP ]proto port".
func (m Mapping) key() string {
	return strings.TrimSpace(m.HostIP + " " + m.Protocol + " " + strconv.Itoa(m.HostPort))
}

// element is the map element that realises m for a Pod at podIP.
func (m Mapping) element(podIP net.IP, owner string) *knftables.Element {
	e := &knftables.Element{
		Map:     mapPorts,
		Key:     []string{m.Protocol, strconv.Itoa(m.HostPort)},
		Value:   []string{podIP.String(), strconv.Itoa(m.ContainerPort)},
		Comment: knftables.PtrTo(owner),
	}
	if m.HostIP != "" {
		e.Map = mapIPPorts
		e.Key = append([]string{m.HostIP}, e.Key...)
	}
	return e
}

// Config says where the Pods are.
type Config struct {
	// Gateway is the gateway interface, through which the host reaches
	// the Pods.
	Gateway string
	// PodCIDR is this Node's podCIDR.
	PodCIDR *net.IPNet
	// ClusterCIDR is every Node's Pods; their connections to a host port
	// are masqueraded.
	ClusterCIDR *net.IPNet
	// ProcSys is the root of the sysctl tree; default /proc/sys.
	ProcSys string
}

// Mapper keeps the host port mappings of this Node's Pods. It is safe for
// concurrent use; ADDs of different Pods each run one transaction.
type Mapper struct {
	nft knftables.Interface
	cfg Config

	mu     sync.Mutex
	owners map[string][]*knftables.Element // owner → its elements
	taken  map[string]string               // mapping key → owner
}

// New returns a Mapper writing TableName through nft (a knftables handle
// for TableName, family ip). Call Start before anything else.
func New(nft knftables.Interface, cfg Config) *Mapper {
	if cfg.ProcSys == "" {
		cfg.ProcSys = "/proc/sys"
	}
	return &Mapper{nft: nft, cfg: cfg, owners: map[string][]*knftables.Element{}, taken: map[string]string{}}
}

// NewNFTables returns the knftables handle for TableName.
func NewNFTables() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.IPv4Family, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return nft, nil
}

// Start writes the table's chains and maps (keeping the elements already
// there, so established hostPort connections survive a daemon restart),
// reads those elements back as the current mappings, and sets
// route_localnet on the gateway.
func (m *Mapper) Start(ctx context.Context) error {
	tx := m.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: Pod hostPorts")})
	tx.Add(&knftables.Map{Name: mapPorts, Type: "inet_proto . inet_service : ipv4_addr . inet_service",
		Comment: knftables.PtrTo("hostPorts on every local address")})
	tx.Add(&knftables.Map{Name: mapIPPorts, Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service",
		Comment: knftables.PtrTo("hostPorts on one hostIP")})
	tx.Add(&knftables.Chain{Name: chainDNAT})
	tx.Flush(&knftables.Chain{Name: chainDNAT})
	tx.Add(&knftables.Rule{Chain: chainDNAT, Rule: "dnat ip to ip daddr . meta l4proto . th dport map @" + mapIPPorts})
	tx.Add(&knftables.Rule{Chain: chainDNAT, Rule: "fib daddr type local dnat ip to meta l4proto . th dport map @" + mapPorts})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{chainPrerouting, knftables.PreroutingHook}, {chainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(knftables.DNATPriority)})
		tx.Flush(&knftables.Chain{Name: c.name})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: "jump " + chainDNAT})
	}
	tx.Add(&knftables.Chain{Name: chainPostrouting, Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)})
	tx.Flush(&knftables.Chain{Name: chainPostrouting})
	tx.Add(&knftables.Rule{Chain: chainPostrouting, Rule: knftables.Concat(
		"oifname", fmt.Sprintf("%q", m.cfg.Gateway), "ip daddr", m.cfg.PodCIDR.String(),
		"ip saddr {", m.cfg.ClusterCIDR.String(), ", 127.0.0.0/8 }", "ct status dnat", "masquerade"),
		Comment: knftables.PtrTo("Pods and localhost reaching a hostPort: replies must return through the host")})
	if err := m.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("programming hostPort table: %w", err)
	}

	owners := map[string][]*knftables.Element{}
	taken := map[string]string{}
	for _, name := range []string{mapPorts, mapIPPorts} {
		els, err := m.nft.ListElements(ctx, "map", name)
		if err != nil {
			return fmt.Errorf("reading hostPort map %s: %w", name, err)
		}
		for _, e := range els {
			owner := ""
			if e.Comment != nil {
				owner = *e.Comment
			}
			e.Map = name
			owners[owner] = append(owners[owner], e)
			taken[strings.Join(e.Key, " ")] = owner
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

// Map adds owner's mappings to the Pod at podIP, in one transaction. A
// host port that another owner holds is refused with an error naming it;
// owner's own earlier mappings (a repeated ADD) are deleted first.
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
		if o, ok := m.taken[mp.key()]; ok && o != owner {
			return fmt.Errorf("hostPort %s is already mapped to attachment %s", mp, o)
		}
	}
	if err := m.deleteLocked(ctx, owner); err != nil {
		return err
	}
	tx := m.nft.NewTransaction()
	els := make([]*knftables.Element, 0, len(mappings))
	for _, mp := range mappings {
		e := mp.element(podIP.To4(), owner)
		tx.Add(e)
		els = append(els, e)
	}
	if err := m.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("mapping hostPorts: %w", err)
	}
	m.owners[owner] = els
	for _, e := range els {
		m.taken[strings.Join(e.Key, " ")] = owner
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
	for _, e := range m.owners[owner] {
		delete(m.taken, strings.Join(e.Key, " "))
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
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("removing hostPort table: %w", err)
	}
	return nil
}

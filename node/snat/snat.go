// Package snat masquerades Pod traffic that leaves the cluster, with
// nftables through sigs.k8s.io/knftables (see docs/design.md for why
// nftables rather than iptables).
//
// The rules live in their own table, "ip seine", and are replaced as a whole
// in one nftables transaction, so they never exist half-written, and only
// when the Node IPs differ from those last written (or were written over a
// minute ago: a table someone removed comes back). Until Prune, the Node
// IPs are only added, so a restarted daemon keeps its previous run's until
// it knows every Node again:
//
//	table ip seine {
//	  set node-ips { type ipv4_addr }          # every Node's InternalIP
//	  chain postrouting {
//	    type nat hook postrouting priority srcnat
//	    ip saddr <clusterCIDR> ip daddr != <clusterCIDR> ip daddr != @node-ips oifname != "<gateway>" masquerade
//	  }
//	}
//
// Pod-to-Pod traffic never matches (destination inside the cluster CIDR),
// nor does Pod-to-Node traffic (destination in node-ips), nor traffic going
// back into the bridge through the gateway.
package snat

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/datapath/nftables"
)

// TableName is the nftables table Seine owns (family ip).
const TableName = "seine"

const (
	setNodeIPs       = "node-ips"
	chainPostrouting = "postrouting"
)

// Masquerade keeps the SNAT rules and the Node IP set in nftables.
type Masquerade struct {
	nft         knftables.Interface
	clusterCIDR *net.IPNet
	gateway     string
	enabled     bool

	mu      sync.Mutex
	nodeIPs map[string]net.IP // Node name → IP

	// runMu serialises the transactions (Sync, Prune, Cleanup) and
	// guards prune and written.
	runMu sync.Mutex
	// prune: a transaction removes from node-ips the IPs no Node
	// recorded. False until Prune, so that a restarted daemon, which
	// records the Nodes one by one, keeps the previous run's IPs
	// meanwhile instead of masquerading Pod traffic to the Nodes it has
	// not recorded yet.
	prune bool
	// written is what the last successful transaction wrote; nil when
	// unknown: before the first, after a failed one, after Cleanup.
	written *tableState
	// now is the clock of rewriteAfter (time.Now; tests set it).
	now func() time.Time
}

// rewriteAfter is how long an unchanged table goes without being written
// again: a Sync after that writes it anyway, so that a table something
// else removed (a firewall reload, nft flush ruleset) comes back with the
// next Node update.
const rewriteAfter = time.Minute

// tableState is what a transaction writes besides the fixed rules.
type tableState struct {
	ips   []string  // node-ips elements, sorted
	prune bool      // node-ips flushed first
	at    time.Time // when it was written
}

// New returns a Masquerade for Pods in clusterCIDR whose gateway interface
// is gateway. With enabled false, Sync keeps the table (and the Node IP
// set) but installs no masquerade rule.
func New(nft knftables.Interface, clusterCIDR *net.IPNet, gateway string, enabled bool) *Masquerade {
	return &Masquerade{nft: nft, clusterCIDR: clusterCIDR, gateway: gateway, enabled: enabled, nodeIPs: map[string]net.IP{},
		now: time.Now}
}

// NewNFTables returns the knftables handle for Seine's table.
func NewNFTables() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.IPv4Family, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return nft, nil
}

// SetNodeIP records (ip non-nil) or forgets (ip nil) a Node's IP.
func (m *Masquerade) SetNodeIP(node string, ip net.IP) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ip == nil {
		delete(m.nodeIPs, node)
	} else {
		m.nodeIPs[node] = ip.To4()
	}
}

// Sync replaces the table's rules with the desired ones and adds the
// recorded Node IPs to node-ips, in one nftables transaction (an nft
// process). Until Prune, IPs already in the set that no Node recorded
// stay (left by the previous run: those of Nodes not recorded yet); from
// Prune on, the set is replaced too. The rules are fixed at New, so when
// the IPs are those the last successful transaction wrote, less than
// rewriteAfter ago, Sync starts none: the route controller calls it for
// every Node it syncs, which at start is every Node, and most of those
// calls change nothing. After a failed transaction, or Cleanup, the next
// Sync writes again.
func (m *Masquerade) Sync(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	return m.write(ctx)
}

// Prune makes node-ips exactly the recorded IPs, now and in every later
// Sync: call it once every Node's IP has been recorded (the route
// controller does, once it has synced every Node known at its start).
func (m *Masquerade) Prune(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.prune = true
	return m.write(ctx)
}

// write runs the transaction for the recorded IPs, unless the last one
// wrote the same. The caller holds runMu.
func (m *Masquerade) write(ctx context.Context) error {
	m.mu.Lock()
	ips := make([]string, 0, len(m.nodeIPs))
	seen := map[string]bool{}
	for _, ip := range m.nodeIPs {
		if ip != nil && !seen[ip.String()] {
			seen[ip.String()] = true
			ips = append(ips, ip.String())
		}
	}
	m.mu.Unlock()
	sort.Strings(ips)
	want := tableState{ips: ips, prune: m.prune, at: m.now()}
	if w := m.written; w != nil && w.prune == want.prune && slices.Equal(w.ips, want.ips) && want.at.Sub(w.at) < rewriteAfter {
		return nil
	}
	m.written = nil

	tx := m.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: Pod SNAT")})
	// Flushing a table removes its rules, not its sets' elements
	// (nft(8), "flush table").
	tx.Flush(&knftables.Table{})
	tx.Add(&knftables.Set{Name: setNodeIPs, Type: "ipv4_addr", Comment: knftables.PtrTo("InternalIP of every Node")})
	if m.prune {
		tx.Flush(&knftables.Set{Name: setNodeIPs})
	}
	for _, ip := range ips {
		tx.Add(&knftables.Element{Set: setNodeIPs, Key: []string{ip}})
	}
	tx.Add(&knftables.Chain{
		Name:     chainPostrouting,
		Type:     knftables.PtrTo(knftables.NATType),
		Hook:     knftables.PtrTo(knftables.PostroutingHook),
		Priority: knftables.PtrTo(knftables.SNATPriority),
	})
	if m.enabled {
		c := m.clusterCIDR.String()
		tx.Add(&knftables.Rule{
			Chain: chainPostrouting,
			Rule: knftables.Concat(
				"ip saddr", c, "ip daddr !=", c,
				"ip daddr != @"+setNodeIPs,
				"oifname !=", fmt.Sprintf("%q", m.gateway),
				"masquerade",
			),
			Comment: knftables.PtrTo("Pod traffic leaving the cluster"),
		})
	}
	if err := m.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("programming SNAT rules: %w", err)
	}
	m.written = &want
	return nil
}

// Cleanup deletes Seine's table.
func (m *Masquerade) Cleanup(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	m.written = nil
	if err := nftables.DeleteTable(ctx, m.nft); err != nil {
		return fmt.Errorf("removing SNAT table: %w", err)
	}
	return nil
}

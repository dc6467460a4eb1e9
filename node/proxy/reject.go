package proxy

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"sigs.k8s.io/knftables"
)

// RejectTable is the nftables table (family ip) that rejects connections to
// Service ports without endpoints. OVS cannot build a TCP RST or an ICMP
// error itself, so such connections are handed to the host through the
// gateway and rejected in the forward path (as kube-proxy's nftables mode
// does for the same case): TCP with a reset, everything else with ICMP
// port unreachable.
const RejectTable = "seine-proxy"

const (
	setNoEndpoints = "no-endpoints"
	chainForward   = "forward"
	chainInput     = "input"
)

// rejecter keeps the set of rejected VIP . protocol . port triples.
type rejecter struct{ nft knftables.Interface }

func newRejecter() (*rejecter, error) {
	nft, err := knftables.New(knftables.IPv4Family, RejectTable)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &rejecter{nft: nft}, nil
}

// reset creates the table, its chains and an empty set.
func (r *rejecter) reset(ctx context.Context) error {
	tx := r.nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("seine: reject connections to Services without endpoints")})
	tx.Flush(&knftables.Table{})
	tx.Add(&knftables.Set{Name: setNoEndpoints, Type: "ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("Service VIP, protocol and port without endpoints")})
	tx.Flush(&knftables.Set{Name: setNoEndpoints})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{chainForward, knftables.ForwardHook}, {chainInput, knftables.InputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.FilterType),
			Hook: knftables.PtrTo(c.hook), Priority: knftables.PtrTo(knftables.FilterPriority + "-10")})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: knftables.Concat(
			"ip daddr . meta l4proto . th dport", "@"+setNoEndpoints, "meta l4proto tcp reject with tcp reset")})
		tx.Add(&knftables.Rule{Chain: c.name, Rule: knftables.Concat(
			"ip daddr . meta l4proto . th dport", "@"+setNoEndpoints, "reject with icmp type port-unreachable")})
	}
	if err := r.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("programming table %s: %w", RejectTable, err)
	}
	return nil
}

func elementKey(vip net.IP, proto uint8, port uint16) []string {
	return []string{vip.String(), strconv.Itoa(int(proto)), strconv.Itoa(int(port))}
}

// update adds and removes elements ([vip, proto, port]) in one transaction.
func (r *rejecter) update(ctx context.Context, add, del [][]string) error {
	if r == nil || (len(add) == 0 && len(del) == 0) {
		return nil
	}
	tx := r.nft.NewTransaction()
	for _, k := range del {
		// Adding first makes the delete succeed even if it is absent.
		tx.Add(&knftables.Element{Set: setNoEndpoints, Key: k})
		tx.Delete(&knftables.Element{Set: setNoEndpoints, Key: k})
	}
	for _, k := range add {
		tx.Add(&knftables.Element{Set: setNoEndpoints, Key: k})
	}
	if err := r.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("updating %s set %s: %w", RejectTable, setNoEndpoints, err)
	}
	return nil
}

package nftables

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/tests/netnstest"
)

// TestDeleteTable runs nft(8) in a fresh network namespace: deleting a
// table that does not exist succeeds, deleting one removes it with its
// chains and rules, and deleting it again succeeds.
func TestDeleteTable(t *testing.T) {
	netnstest.Run(t, func() {
		ctx := context.Background()
		nft, err := knftables.New(knftables.IPv4Family, "seine-test")
		if err != nil {
			t.Fatal(err)
		}
		if err := DeleteTable(ctx, nft); err != nil {
			t.Fatalf("deleting a table that does not exist: %v", err)
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "c"})
		tx.Add(&knftables.Rule{Chain: "c", Rule: "counter"})
		if err := nft.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if chains, err := nft.List(ctx, "chains"); err != nil || len(chains) != 1 {
			t.Fatalf("before: chains %v, %v", chains, err)
		}
		if err := DeleteTable(ctx, nft); err != nil {
			t.Fatal(err)
		}
		if chains, err := nft.List(ctx, "chains"); !knftables.IsNotFound(err) {
			t.Errorf("after: chains %v, err %v; want the table gone", chains, err)
		}
		if err := DeleteTable(ctx, nft); err != nil {
			t.Errorf("deleting it again: %v", err)
		}
	})
}

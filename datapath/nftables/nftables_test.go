package nftables

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"
)

func TestDeleteTable(t *testing.T) {
	ctx := context.Background()
	nft := knftables.NewFake(knftables.IPv4Family, "seine-test")
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
	if err := DeleteTable(ctx, nft); err != nil {
		t.Fatal(err)
	}
	if nft.Table != nil {
		t.Errorf("table left: %s", nft.Dump())
	}
	if err := DeleteTable(ctx, nft); err != nil {
		t.Errorf("deleting it again: %v", err)
	}
}

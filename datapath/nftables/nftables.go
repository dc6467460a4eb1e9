// Package nftables holds what Seine's users of nftables (the hostPort map,
// SNAT, the Service proxy's host table, the tunnel's transport tables)
// share on top of sigs.k8s.io/knftables. Each of them owns one table, named
// when its knftables.Interface is made.
package nftables

import (
	"context"

	"sigs.k8s.io/knftables"
)

// DeleteTable removes the table nft was made for, with everything in it,
// in one transaction. A table that does not exist is not an error: the
// transaction adds it before deleting it (an add of an existing table is a
// no-op, nft(8), "TABLES"), so uninstalling twice is harmless and no
// error-string matching is needed.
func DeleteTable(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	return nft.Run(ctx, tx)
}

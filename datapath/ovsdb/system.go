package ovsdb

import (
	"context"
	"fmt"

	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
)

// FlowRestoreWait is the Open_vSwitch other_config key that holds a
// restarting ovs-vswitchd back (ovs-vswitchd.conf.db(5), Open_vSwitch
// table, other_config:flow-restore-wait): while it is "true" the daemon
// keeps the kernel datapath's flows, so established traffic keeps
// forwarding, and processes no new traffic until the controller has put
// its flows back and removed the key.
const FlowRestoreWait = "flow-restore-wait"

// ClearFlowRestoreWait removes other_config:flow-restore-wait, if set, once
// the caller's flows are installed. A missing key is not an error.
func (c *Client) ClearFlowRestoreWait(ctx context.Context) error {
	return c.transact(ctx, "clear other_config:"+FlowRestoreWait, func(ctx context.Context) (*txn, error) {
		root, err := c.root(ctx)
		if err != nil {
			return nil, err
		}
		v, ok := root.OtherConfig[FlowRestoreWait]
		if !ok {
			return nil, nil
		}
		t := &txn{cfgIndex: -1}
		if err := t.add(c.ovs.Where(root).Mutate(root, model.Mutation{
			Field: &root.OtherConfig, Mutator: libovsdb.MutateOperationDelete, Value: map[string]string{FlowRestoreWait: v},
		})); err != nil {
			return nil, fmt.Errorf("build other_config mutation: %w", err)
		}
		return t, nil
	})
}

// WaitInitialized waits until the database has its Open_vSwitch row
// (`ovs-vsctl init` has run), as a freshly started ovsdb-server may not yet.
func (c *Client) WaitInitialized(ctx context.Context) error {
	return c.waitUntil(ctx, "the Open_vSwitch row", func() (bool, error) {
		_, err := c.root(ctx)
		return err == nil, nil
	})
}

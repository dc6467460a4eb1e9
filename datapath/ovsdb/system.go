package ovsdb

import (
	"context"
	"fmt"
	"maps"

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

// SystemOtherConfig returns a copy of the other_config column of the
// Open_vSwitch table's single row: settings of ovs-vswitchd as a whole
// (ovs-vswitchd.conf.db(5), Open_vSwitch table), such as
// userspace-tso-enable.
func (c *Client) SystemOtherConfig(ctx context.Context) (map[string]string, error) {
	root, err := c.root(ctx)
	if err != nil {
		return nil, err
	}
	oc := maps.Clone(root.OtherConfig)
	if oc == nil {
		oc = map[string]string{}
	}
	return oc, nil
}

// SetSystemOtherConfig merges kv into the Open_vSwitch row's other_config:
// the keys given are set, other keys are kept. It does not wait for
// ovs-vswitchd: some of these keys are read only when the daemon starts.
// Errors: no Open_vSwitch row, a failed transaction.
func (c *Client) SetSystemOtherConfig(ctx context.Context, kv map[string]string) error {
	return c.transact(ctx, "set other_config of Open_vSwitch", func(ctx context.Context) (*txn, error) {
		root, err := c.root(ctx)
		if err != nil {
			return nil, err
		}
		if containsAll(root.OtherConfig, kv) {
			return nil, nil
		}
		t := &txn{cfgIndex: -1}
		if err := t.add(c.ovs.Where(root).Mutate(root, mergeMapMutations(&root.OtherConfig, kv)...)); err != nil {
			return nil, err
		}
		return t, nil
	})
}

package ovsdb

import (
	"context"
	"maps"
)

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

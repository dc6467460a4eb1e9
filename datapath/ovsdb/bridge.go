package ovsdb

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsdb/vswitch"
)

// ErrBridgeNotFound is returned (wrapped) by methods that need an existing
// bridge when there is no Bridge row of that name.
var ErrBridgeNotFound = errors.New("bridge not found")

// Datapath types accepted in BridgeConfig.DatapathType
// (ovs-vswitchd.conf.db(5), Bridge table, column datapath_type).
const (
	// DatapathSystem is the Linux kernel datapath (the openvswitch module).
	DatapathSystem = "system"
	// DatapathNetdev is the userspace datapath inside ovs-vswitchd.
	DatapathNetdev = "netdev"
)

// Fail modes accepted in BridgeConfig.FailMode.
const (
	FailModeSecure     = "secure"
	FailModeStandalone = "standalone"
)

// maxTableID is the highest OpenFlow table number that Bridge.flow_tables
// accepts (table 255 is reserved by OpenFlow for "all tables").
const maxTableID = 254

// BridgeConfig is the desired state of one bridge.
type BridgeConfig struct {
	// Name of the bridge and of its own internal port and interface;
	// at most 15 bytes, as it also names a network device.
	Name string
	// DatapathType is "system" or "netdev"; empty leaves it unchanged on
	// an existing bridge and means OVS' default ("system") on a new one.
	DatapathType string
	// ExternalIDs are merged into the bridge's existing external_ids: the
	// keys given here are set, other keys are kept.
	ExternalIDs map[string]string
	// OtherConfig is merged into the bridge's other_config like
	// ExternalIDs (e.g. "hwaddr": the MAC of the bridge's own internal
	// interface, ovs-vswitchd.conf.db(5), Bridge table).
	OtherConfig map[string]string
	// FailMode is what the bridge does without flows from a controller
	// (ovs-vswitchd.conf.db(5), Bridge table, fail_mode): FailModeSecure
	// (the default: nothing passes until flows are installed) or
	// FailModeStandalone (with no controller configured, the bridge is an
	// ordinary learning switch until flows are installed, e.g. right after
	// ovs-vswitchd restarts). Converged on existing bridges.
	FailMode string
	// TableNames names OpenFlow tables (Bridge.flow_tables ->
	// Flow_Table.name), so that `ovs-ofctl dump-flows --names` and
	// `ovs-ofctl dump-tables` show them. Keys are table numbers 0-254.
	// Tables not listed keep whatever name they had.
	TableNames map[uint8]string
}

// EnsureBridge makes the bridge match cfg. A missing bridge is created
// with cfg.FailMode (default secure: no flows until a controller installs
// them),
// protocols OpenFlow10, OpenFlow13 and OpenFlow15, and its own internal port
// named like the bridge; an existing bridge gets its datapath type,
// external_ids, other_config and table names updated. It is idempotent and returns once
// ovs-vswitchd has applied the change, so the bridge's OpenFlow management
// socket exists when it returns.
//
// Errors: invalid cfg (empty name, unknown datapath type), no
// Open_vSwitch row, a failed transaction, or ctx ending before
// ovs-vswitchd caught up.
func (c *Client) EnsureBridge(ctx context.Context, cfg BridgeConfig) error {
	if cfg.Name == "" {
		return errors.New("ensure bridge: empty name")
	}
	switch cfg.DatapathType {
	case "", DatapathSystem, DatapathNetdev:
	default:
		return fmt.Errorf("ensure bridge %q: unknown datapath type %q", cfg.Name, cfg.DatapathType)
	}
	switch cfg.FailMode {
	case "":
		cfg.FailMode = FailModeSecure
	case FailModeSecure, FailModeStandalone:
	default:
		return fmt.Errorf("ensure bridge %q: unknown fail mode %q", cfg.Name, cfg.FailMode)
	}
	for id := range cfg.TableNames {
		if id > maxTableID {
			return fmt.Errorf("ensure bridge %q: table %d out of range 0-%d", cfg.Name, id, maxTableID)
		}
	}
	created := false
	err := c.transact(ctx, "ensure bridge "+cfg.Name, func(ctx context.Context) (*txn, error) {
		root, err := c.root(ctx)
		if err != nil {
			return nil, err
		}
		br, err := c.bridgeByName(ctx, cfg.Name)
		if err != nil {
			return nil, err
		}
		t := &txn{cfgIndex: -1}
		if br == nil {
			created = true
			err = c.createBridgeOps(t, root, cfg)
		} else {
			created = false
			err = c.updateBridgeOps(ctx, t, br, cfg)
		}
		if err != nil {
			return nil, err
		}
		if len(t.ops) == 0 {
			return nil, nil
		}
		if err := c.requestReconfigure(t, root); err != nil {
			return nil, err
		}
		return t, nil
	})
	if err != nil {
		return err
	}
	if created {
		c.log.Info("created ovs bridge", zap.String("bridge", cfg.Name), zap.String("datapath_type", cfg.DatapathType))
		return nil
	}
	// Nothing changed here, but the bridge may have been created a moment
	// ago by another caller: wait until ovs-vswitchd has caught up with
	// everything committed so far.
	root, err := c.root(ctx)
	if err != nil {
		return fmt.Errorf("ensure bridge %s: %w", cfg.Name, err)
	}
	if err := c.waitApplied(ctx, root.NextCfg); err != nil {
		return fmt.Errorf("ensure bridge %s: %w", cfg.Name, err)
	}
	return nil
}

// createBridgeOps adds the operations that create the bridge, its internal
// port and its named flow tables, and attach the bridge to the root row.
func (c *Client) createBridgeOps(t *txn, root *vswitch.OpenvSwitch, cfg BridgeConfig) error {
	iface := &vswitch.Interface{UUID: c.uuidName("iface"), Name: cfg.Name, Type: "internal"}
	port := &vswitch.Port{UUID: c.uuidName("port"), Name: cfg.Name, Interfaces: []string{iface.UUID}}
	failMode := vswitch.BridgeFailMode(cfg.FailMode)
	br := &vswitch.Bridge{
		UUID:         c.uuidName("bridge"),
		Name:         cfg.Name,
		DatapathType: cfg.DatapathType,
		ExternalIDs:  maps.Clone(cfg.ExternalIDs),
		OtherConfig:  maps.Clone(cfg.OtherConfig),
		FailMode:     &failMode,
		Protocols: []vswitch.BridgeProtocols{
			vswitch.BridgeProtocolsOpenflow10,
			vswitch.BridgeProtocolsOpenflow13,
			vswitch.BridgeProtocolsOpenflow15,
		},
		Ports: []string{port.UUID},
	}
	rows := []model.Model{iface, port}
	if len(cfg.TableNames) > 0 {
		br.FlowTables = make(map[int]string, len(cfg.TableNames))
		for id, name := range cfg.TableNames {
			ft := &vswitch.FlowTable{UUID: c.uuidName(fmt.Sprintf("table%d", id)), Name: &name}
			rows = append(rows, ft)
			br.FlowTables[int(id)] = ft.UUID
		}
	}
	rows = append(rows, br)
	if err := t.add(c.ovs.Create(rows...)); err != nil {
		return fmt.Errorf("build bridge insert: %w", err)
	}
	if err := t.add(c.ovs.Where(root).Mutate(root, model.Mutation{
		Field: &root.Bridges, Mutator: libovsdb.MutateOperationInsert, Value: []string{br.UUID},
	})); err != nil {
		return fmt.Errorf("build attach of bridge to Open_vSwitch: %w", err)
	}
	return nil
}

// updateBridgeOps adds the operations that bring an existing bridge to cfg;
// it adds none when the bridge already matches.
func (c *Client) updateBridgeOps(ctx context.Context, t *txn, br *vswitch.Bridge, cfg BridgeConfig) error {
	if cfg.DatapathType != "" && br.DatapathType != cfg.DatapathType {
		br.DatapathType = cfg.DatapathType
		if err := t.add(c.ovs.Where(br).Update(br, &br.DatapathType)); err != nil {
			return fmt.Errorf("build datapath_type update: %w", err)
		}
	}
	if br.FailMode == nil || string(*br.FailMode) != cfg.FailMode {
		fm := vswitch.BridgeFailMode(cfg.FailMode)
		br.FailMode = &fm
		if err := t.add(c.ovs.Where(br).Update(br, &br.FailMode)); err != nil {
			return fmt.Errorf("build fail_mode update: %w", err)
		}
	}
	var mutations []model.Mutation
	if !containsAll(br.ExternalIDs, cfg.ExternalIDs) {
		mutations = append(mutations, mergeMapMutations(&br.ExternalIDs, cfg.ExternalIDs)...)
	}
	if !containsAll(br.OtherConfig, cfg.OtherConfig) {
		mutations = append(mutations, mergeMapMutations(&br.OtherConfig, cfg.OtherConfig)...)
	}
	newTables := map[int]string{}
	for id, name := range cfg.TableNames {
		ftUUID, ok := br.FlowTables[int(id)]
		if !ok {
			ft := &vswitch.FlowTable{UUID: c.uuidName(fmt.Sprintf("table%d", id)), Name: &name}
			if err := t.add(c.ovs.Create(ft)); err != nil {
				return fmt.Errorf("build Flow_Table insert: %w", err)
			}
			newTables[int(id)] = ft.UUID
			continue
		}
		ft := &vswitch.FlowTable{UUID: ftUUID}
		if err := c.ovs.Get(ctx, ft); err != nil {
			// The reference exists but the row is not cached yet: let
			// transact retry on a fresher cache.
			return fmt.Errorf("%w: Flow_Table %s of bridge %q: %w", errConflict, ftUUID, br.Name, err)
		}
		if ft.Name != nil && *ft.Name == name {
			continue
		}
		ft.Name = &name
		if err := t.add(c.ovs.Where(ft).Update(ft, &ft.Name)); err != nil {
			return fmt.Errorf("build Flow_Table name update: %w", err)
		}
	}
	if len(newTables) > 0 {
		mutations = append(mutations, model.Mutation{
			Field: &br.FlowTables, Mutator: libovsdb.MutateOperationInsert, Value: newTables,
		})
	}
	if len(mutations) > 0 {
		if err := t.add(c.ovs.Where(br).Mutate(br, mutations...)); err != nil {
			return fmt.Errorf("build bridge mutation: %w", err)
		}
	}
	return nil
}

// DeleteBridge removes the bridge with all its ports; a missing bridge is
// not an error. It returns once ovs-vswitchd has applied the change.
func (c *Client) DeleteBridge(ctx context.Context, name string) error {
	return c.transact(ctx, "delete bridge "+name, func(ctx context.Context) (*txn, error) {
		br, err := c.bridgeByName(ctx, name)
		if err != nil || br == nil {
			return nil, err
		}
		root, err := c.root(ctx)
		if err != nil {
			return nil, err
		}
		t := &txn{cfgIndex: -1}
		// Bridge, Port, Interface and Flow_Table are not root tables: the
		// server garbage-collects them once unreferenced.
		if err := t.add(c.ovs.Where(root).Mutate(root, model.Mutation{
			Field: &root.Bridges, Mutator: libovsdb.MutateOperationDelete, Value: []string{br.UUID},
		})); err != nil {
			return nil, fmt.Errorf("build detach of bridge: %w", err)
		}
		if err := c.requestReconfigure(t, root); err != nil {
			return nil, err
		}
		return t, nil
	})
}

// BridgeExternalIDs returns a copy of the bridge's external_ids (an empty,
// non-nil map when it has none). Errors: ErrBridgeNotFound (wrapped).
func (c *Client) BridgeExternalIDs(ctx context.Context, bridge string) (map[string]string, error) {
	br, err := c.bridgeByName(ctx, bridge)
	if err != nil {
		return nil, err
	}
	if br == nil {
		return nil, fmt.Errorf("bridge %q: %w", bridge, ErrBridgeNotFound)
	}
	ids := maps.Clone(br.ExternalIDs)
	if ids == nil {
		ids = map[string]string{}
	}
	return ids, nil
}

// SetBridgeExternalIDs merges ids into the bridge's external_ids: the keys
// given are set, other keys are kept. It returns once the local cache shows
// the change, so a following BridgeExternalIDs sees it.
// Errors: ErrBridgeNotFound (wrapped), a failed transaction.
func (c *Client) SetBridgeExternalIDs(ctx context.Context, bridge string, ids map[string]string) error {
	what := "set external_ids of bridge " + bridge
	err := c.transact(ctx, what, func(ctx context.Context) (*txn, error) {
		br, err := c.bridgeByName(ctx, bridge)
		if err != nil {
			return nil, err
		}
		if br == nil {
			return nil, fmt.Errorf("bridge %q: %w", bridge, ErrBridgeNotFound)
		}
		if containsAll(br.ExternalIDs, ids) {
			return nil, nil
		}
		t := &txn{cfgIndex: -1}
		if err := t.add(c.ovs.Where(br).Mutate(br, mergeMapMutations(&br.ExternalIDs, ids)...)); err != nil {
			return nil, fmt.Errorf("build external_ids mutation: %w", err)
		}
		return t, nil
	})
	if err != nil {
		return err
	}
	return c.waitUntil(ctx, what+" in cache", func() (bool, error) {
		br, err := c.bridgeByName(ctx, bridge)
		if err != nil {
			return false, err
		}
		// A bridge deleted meanwhile ends the wait: there is nothing to see.
		return br == nil || containsAll(br.ExternalIDs, ids), nil
	})
}

package ovsdb

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/ovsdb/vswitch"
)

// Interface types accepted in PortSpec.Type (ovs-vswitchd.conf.db(5),
// Interface table, column type).
const (
	// TypeSystem is an existing network device, such as one end of a veth pair.
	TypeSystem = ""
	// TypeInternal is a device that OVS creates (a tap device with the
	// userspace datapath).
	TypeInternal = "internal"
	// TypeGeneve, TypeVXLAN and TypeGRE are tunnel ports; with
	// Options{"remote_ip": "flow", "key": "flow"} the flows choose the
	// remote endpoint and tunnel key.
	TypeGeneve = "geneve"
	TypeVXLAN  = "vxlan"
	TypeGRE    = "gre"
)

// maxOFPortRequest is the highest port number ofport_request accepts: the
// OpenFlow 1.0 range of physical ports, 1-65279 (0xfeff).
const maxOFPortRequest = 0xfeff

// PortSpec is the desired state of one single-interface port; the port and
// its interface share the name.
type PortSpec struct {
	// Name of the port and its interface; for system and internal ports it
	// is a network device name, so at most 15 bytes.
	Name string
	// Type is Interface.type: "" (an existing system device, e.g. a veth),
	// "internal", "geneve", "vxlan", "gre".
	Type string
	// Options is Interface.options and replaces it entirely, e.g.
	// remote_ip=flow, key=flow, csum=true for tunnels.
	Options map[string]string
	// ExternalIDs are merged into the external_ids of both the Port and
	// the Interface row: the keys given are set, other keys are kept.
	ExternalIDs map[string]string
	// MTURequest is Interface.mtu_request in bytes; 0 leaves it unchanged.
	MTURequest int
	// OFPortRequest is Interface.ofport_request, 1-65279; 0 lets OVS choose
	// (and leaves an existing request unchanged).
	OFPortRequest int32
}

// Port is the observed state of a port and its interface.
type Port struct {
	// Name of the port (and of its interface).
	Name string
	// Type is Interface.type.
	Type string
	// OFPort is the OpenFlow port number ovs-vswitchd assigned; 0 while
	// not yet assigned, -1 when the interface failed.
	OFPort int32
	// ExternalIDs is a copy of the Port row's external_ids.
	ExternalIDs map[string]string
	// MAC is Interface.mac_in_use ("aa:bb:cc:dd:ee:ff"), empty when unknown.
	MAC string
}

// EnsurePort creates the port on bridge, or updates an existing port of that
// name to match spec (moving it from another bridge if needed), then waits
// until ctx ends for ovs-vswitchd to assign an OpenFlow port number (> 0)
// and returns the port.
//
// Errors: invalid spec, ErrBridgeNotFound (wrapped), a port of that name
// whose interface is named differently, a failed transaction, ctx ending
// first, or an interface that ovs-vswitchd failed to open (Interface.error
// set or ofport -1): that error names the interface and quotes OVS' message.
func (c *Client) EnsurePort(ctx context.Context, bridge string, spec PortSpec) (Port, error) {
	if spec.Name == "" {
		return Port{}, errors.New("ensure port: empty name")
	}
	if spec.MTURequest < 0 {
		return Port{}, fmt.Errorf("ensure port %q: negative mtu_request %d", spec.Name, spec.MTURequest)
	}
	if spec.OFPortRequest < 0 || spec.OFPortRequest > maxOFPortRequest {
		return Port{}, fmt.Errorf("ensure port %q: ofport_request %d out of range 1-%d", spec.Name, spec.OFPortRequest, maxOFPortRequest)
	}
	what := fmt.Sprintf("ensure port %s on bridge %s", spec.Name, bridge)
	err := c.transact(ctx, what, func(ctx context.Context) (*txn, error) {
		return c.ensurePortOps(ctx, bridge, spec)
	})
	if err != nil {
		return Port{}, err
	}
	var result Port
	err = c.waitUntil(ctx, fmt.Sprintf("ofport of interface %s", spec.Name), func() (bool, error) {
		iface, err := c.interfaceByName(ctx, spec.Name)
		if err != nil || iface == nil {
			return false, err
		}
		if iface.Error != nil && *iface.Error != "" {
			return false, fmt.Errorf("interface %s: ovs-vswitchd reports: %s", spec.Name, *iface.Error)
		}
		ofport := deref(iface.Ofport)
		if ofport == -1 {
			return false, fmt.Errorf("interface %s: ovs-vswitchd could not open it (ofport -1)", spec.Name)
		}
		if ofport <= 0 {
			return false, nil
		}
		p, err := c.portByName(ctx, spec.Name)
		if err != nil || p == nil {
			return false, err
		}
		result = toPort(p, iface)
		return true, nil
	})
	if err != nil {
		return Port{}, fmt.Errorf("%s: %w", what, err)
	}
	c.log.Debug("ovs port ready", zap.String("bridge", bridge), zap.String("port", spec.Name),
		zap.Int32("ofport", result.OFPort))
	return result, nil
}

// ensurePortOps builds the transaction of one EnsurePort attempt.
func (c *Client) ensurePortOps(ctx context.Context, bridge string, spec PortSpec) (*txn, error) {
	root, err := c.root(ctx)
	if err != nil {
		return nil, err
	}
	br, err := c.bridgeByName(ctx, bridge)
	if err != nil {
		return nil, err
	}
	if br == nil {
		return nil, fmt.Errorf("bridge %q: %w", bridge, ErrBridgeNotFound)
	}
	port, err := c.portByName(ctx, spec.Name)
	if err != nil {
		return nil, err
	}
	iface, err := c.interfaceByName(ctx, spec.Name)
	if err != nil {
		return nil, err
	}
	t := &txn{cfgIndex: -1}
	reconfigure := true
	if port == nil {
		if iface != nil {
			// An interface row is unreferenced only for the instant
			// before garbage collection; otherwise it belongs to a port
			// with another name.
			return nil, fmt.Errorf("%w: interface %q exists without a port of the same name", errConflict, spec.Name)
		}
		if err := c.createPortOps(t, br, spec); err != nil {
			return nil, err
		}
	} else {
		if iface == nil {
			return nil, fmt.Errorf("%w: port %q is cached but its interface is not", errConflict, spec.Name)
		}
		if !slices.Contains(port.Interfaces, iface.UUID) {
			return nil, fmt.Errorf("port %q exists but interface %q belongs to another port", spec.Name, spec.Name)
		}
		if reconfigure, err = c.updatePortOps(ctx, t, br, port, iface, spec); err != nil {
			return nil, err
		}
	}
	failed := interfaceFailed(iface)
	if len(t.ops) == 0 && !failed {
		return nil, nil
	}
	// Also for an unchanged interface that failed: a reconfiguration makes
	// ovs-vswitchd try to open its device again (it may exist by now). A
	// change of external_ids only is nothing ovs-vswitchd acts on, so
	// there is nothing to wait for.
	if reconfigure || failed {
		if err := c.requestReconfigure(t, root); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// interfaceFailed reports whether ovs-vswitchd could not open iface.
func interfaceFailed(iface *vswitch.Interface) bool {
	return iface != nil && (deref(iface.Error) != "" || deref(iface.Ofport) == -1)
}

// createPortOps adds the operations that create the port and its interface
// and attach the port to br.
func (c *Client) createPortOps(t *txn, br *vswitch.Bridge, spec PortSpec) error {
	iface := &vswitch.Interface{
		UUID:        c.uuidName("iface"),
		Name:        spec.Name,
		Type:        spec.Type,
		Options:     maps.Clone(spec.Options),
		ExternalIDs: maps.Clone(spec.ExternalIDs),
	}
	if spec.MTURequest > 0 {
		mtu := spec.MTURequest
		iface.MTURequest = &mtu
	}
	if spec.OFPortRequest > 0 {
		req := int(spec.OFPortRequest)
		iface.OfportRequest = &req
	}
	port := &vswitch.Port{
		UUID:        c.uuidName("port"),
		Name:        spec.Name,
		Interfaces:  []string{iface.UUID},
		ExternalIDs: maps.Clone(spec.ExternalIDs),
	}
	if err := t.add(c.ovs.Create(iface, port)); err != nil {
		return fmt.Errorf("build port insert: %w", err)
	}
	if err := t.add(c.ovs.Where(br).Mutate(br, model.Mutation{
		Field: &br.Ports, Mutator: libovsdb.MutateOperationInsert, Value: []string{port.UUID},
	})); err != nil {
		return fmt.Errorf("build attach of port to bridge: %w", err)
	}
	return nil
}

// updatePortOps adds the operations that bring an existing port and its
// interface to spec and onto br; none when they already match. reconfigure
// reports whether they change anything but external_ids.
func (c *Client) updatePortOps(ctx context.Context, t *txn, br *vswitch.Bridge, port *vswitch.Port, iface *vswitch.Interface, spec PortSpec) (reconfigure bool, err error) {
	if !slices.Contains(br.Ports, port.UUID) {
		reconfigure = true
		owner, err := c.bridgeOfPort(ctx, port.UUID)
		if err != nil {
			return false, err
		}
		if owner == nil {
			return false, fmt.Errorf("%w: port %q is on no bridge", errConflict, spec.Name)
		}
		// Both mutations commit together, so the port is never
		// unreferenced (and never garbage-collected) in between.
		if err := t.add(c.ovs.Where(owner).Mutate(owner, model.Mutation{
			Field: &owner.Ports, Mutator: libovsdb.MutateOperationDelete, Value: []string{port.UUID},
		})); err != nil {
			return false, fmt.Errorf("build detach of port from bridge %s: %w", owner.Name, err)
		}
		if err := t.add(c.ovs.Where(br).Mutate(br, model.Mutation{
			Field: &br.Ports, Mutator: libovsdb.MutateOperationInsert, Value: []string{port.UUID},
		})); err != nil {
			return false, fmt.Errorf("build attach of port to bridge: %w", err)
		}
	}

	var fields []interface{}
	if iface.Type != spec.Type {
		iface.Type = spec.Type
		fields = append(fields, &iface.Type)
	}
	if !maps.Equal(iface.Options, spec.Options) {
		iface.Options = maps.Clone(spec.Options)
		if iface.Options == nil {
			iface.Options = map[string]string{}
		}
		fields = append(fields, &iface.Options)
	}
	if spec.MTURequest > 0 && deref(iface.MTURequest) != spec.MTURequest {
		mtu := spec.MTURequest
		iface.MTURequest = &mtu
		fields = append(fields, &iface.MTURequest)
	}
	if spec.OFPortRequest > 0 && deref(iface.OfportRequest) != int(spec.OFPortRequest) {
		req := int(spec.OFPortRequest)
		iface.OfportRequest = &req
		fields = append(fields, &iface.OfportRequest)
	}
	if len(fields) > 0 {
		reconfigure = true
		if err := t.add(c.ovs.Where(iface).Update(iface, fields...)); err != nil {
			return false, fmt.Errorf("build interface update: %w", err)
		}
	}
	if !containsAll(iface.ExternalIDs, spec.ExternalIDs) {
		if err := t.add(c.ovs.Where(iface).Mutate(iface, mergeMapMutations(&iface.ExternalIDs, spec.ExternalIDs)...)); err != nil {
			return false, fmt.Errorf("build interface external_ids mutation: %w", err)
		}
	}
	if !containsAll(port.ExternalIDs, spec.ExternalIDs) {
		if err := t.add(c.ovs.Where(port).Mutate(port, mergeMapMutations(&port.ExternalIDs, spec.ExternalIDs)...)); err != nil {
			return false, fmt.Errorf("build port external_ids mutation: %w", err)
		}
	}
	return reconfigure, nil
}

// SetPortExternalIDs merges ids into the external_ids of the port called
// name and of its interface (the keys given are set, others kept). A port
// that does not exist is left alone: nothing is created, and that is not
// an error. It does not wait for ovs-vswitchd, which does not act on
// external_ids. Errors: a failed transaction.
func (c *Client) SetPortExternalIDs(ctx context.Context, name string, ids map[string]string) error {
	return c.transact(ctx, fmt.Sprintf("external_ids of port %s", name), func(ctx context.Context) (*txn, error) {
		port, err := c.portByName(ctx, name)
		if err != nil || port == nil {
			return nil, err
		}
		t := &txn{cfgIndex: -1}
		if !containsAll(port.ExternalIDs, ids) {
			if err := t.add(c.ovs.Where(port).Mutate(port, mergeMapMutations(&port.ExternalIDs, ids)...)); err != nil {
				return nil, fmt.Errorf("build port external_ids mutation: %w", err)
			}
		}
		iface, err := c.primaryInterface(ctx, port)
		if err != nil {
			return nil, err
		}
		if iface != nil && !containsAll(iface.ExternalIDs, ids) {
			if err := t.add(c.ovs.Where(iface).Mutate(iface, mergeMapMutations(&iface.ExternalIDs, ids)...)); err != nil {
				return nil, fmt.Errorf("build interface external_ids mutation: %w", err)
			}
		}
		return t, nil
	})
}

// DeletePort removes the port from bridge; a missing port is not an error.
// It returns once ovs-vswitchd has applied the change.
// Errors: the port exists on another bridge, a failed transaction.
func (c *Client) DeletePort(ctx context.Context, bridge, name string) error {
	return c.transact(ctx, fmt.Sprintf("delete port %s from bridge %s", name, bridge), func(ctx context.Context) (*txn, error) {
		port, err := c.portByName(ctx, name)
		if err != nil || port == nil {
			return nil, err
		}
		owner, err := c.bridgeOfPort(ctx, port.UUID)
		if err != nil || owner == nil {
			// A port on no bridge is being garbage-collected already.
			return nil, err
		}
		if owner.Name != bridge {
			return nil, fmt.Errorf("port %q is on bridge %q, not %q", name, owner.Name, bridge)
		}
		root, err := c.root(ctx)
		if err != nil {
			return nil, err
		}
		t := &txn{cfgIndex: -1}
		if err := t.add(c.ovs.Where(owner).Mutate(owner, model.Mutation{
			Field: &owner.Ports, Mutator: libovsdb.MutateOperationDelete, Value: []string{port.UUID},
		})); err != nil {
			return nil, fmt.Errorf("build detach of port: %w", err)
		}
		if err := c.requestReconfigure(t, root); err != nil {
			return nil, err
		}
		return t, nil
	})
}

// GetPort returns the port called name on any bridge, or nil, nil when
// there is none.
func (c *Client) GetPort(ctx context.Context, name string) (*Port, error) {
	port, err := c.portByName(ctx, name)
	if err != nil || port == nil {
		return nil, err
	}
	iface, err := c.primaryInterface(ctx, port)
	if err != nil {
		return nil, err
	}
	p := toPort(port, iface)
	return &p, nil
}

// ListPorts returns the ports of bridge, including the bridge's own
// internal port, sorted by name.
// Errors: ErrBridgeNotFound (wrapped).
func (c *Client) ListPorts(ctx context.Context, bridge string) ([]Port, error) {
	br, err := c.bridgeByName(ctx, bridge)
	if err != nil {
		return nil, err
	}
	if br == nil {
		return nil, fmt.Errorf("bridge %q: %w", bridge, ErrBridgeNotFound)
	}
	ports := make([]Port, 0, len(br.Ports))
	for _, uuid := range br.Ports {
		port := &vswitch.Port{UUID: uuid}
		if err := c.ovs.Get(ctx, port); err != nil {
			// Referenced but not yet cached: the cache lags by at most
			// one update, so skip it rather than fail.
			continue
		}
		iface, err := c.primaryInterface(ctx, port)
		if err != nil {
			return nil, err
		}
		ports = append(ports, toPort(port, iface))
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].Name < ports[j].Name })
	return ports, nil
}

// primaryInterface returns the interface of port that shares its name, or
// else its first cached interface, or nil.
func (c *Client) primaryInterface(ctx context.Context, port *vswitch.Port) (*vswitch.Interface, error) {
	var first *vswitch.Interface
	for _, uuid := range port.Interfaces {
		iface := &vswitch.Interface{UUID: uuid}
		if err := c.ovs.Get(ctx, iface); err != nil {
			continue
		}
		if iface.Name == port.Name {
			return iface, nil
		}
		if first == nil {
			first = iface
		}
	}
	return first, nil
}

// toPort converts cached rows into a Port; iface may be nil.
func toPort(port *vswitch.Port, iface *vswitch.Interface) Port {
	p := Port{Name: port.Name, ExternalIDs: maps.Clone(port.ExternalIDs)}
	if p.ExternalIDs == nil {
		p.ExternalIDs = map[string]string{}
	}
	if iface != nil {
		p.Type = iface.Type
		p.OFPort = int32(deref(iface.Ofport))
		p.MAC = deref(iface.MACInUse)
	}
	return p
}

// deref returns *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Package ovsdb manages the Open vSwitch configuration database
// (bridges, ports, interfaces and OpenFlow table names) through libovsdb
// with the typed models of package vswitch.
//
// The Client keeps a local cache of the Open_vSwitch, Bridge, Port,
// Interface and Flow_Table tables (an OVSDB monitor, RFC 7047 section 4.1.5)
// and reads only from that cache; every change is one atomic OVSDB
// transaction built from mutate/insert operations with named UUIDs, so the
// methods are safe to call from many goroutines and from several processes
// at once. A transaction that loses a race (a unique-name constraint, or an
// update that matched no row because the row vanished) is rebuilt from the
// refreshed cache and retried.
//
// Changes that ovs-vswitchd must act on also bump Open_vSwitch.next_cfg, and
// the methods return only once ovs-vswitchd has copied that value to
// Open_vSwitch.cur_cfg, which it does after applying the configuration
// (ovs-vswitchd.conf.db(5), "Open_vSwitch" table, columns next_cfg and
// cur_cfg). This is the same handshake `ovs-vsctl` uses unless --no-wait is
// given.
package ovsdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-logr/zapr"
	"github.com/ovn-org/libovsdb/cache"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"
	libovsdb "github.com/ovn-org/libovsdb/ovsdb"
	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/groupcommit"
	"github.com/seine-net/seine/datapath/ovsdb/vswitch"
)

const (
	// databaseName is the name of the vswitch database (ovs-vswitchd.conf.db(5)).
	databaseName = "Open_vSwitch"
	// maxAttempts bounds how often a transaction that lost a race is rebuilt.
	maxAttempts = 8
	// pollInterval is the fallback re-check period while waiting on the
	// cache, for updates whose cache events were missed (events can be
	// dropped when libovsdb's event buffer is full, or the cache replaced on
	// reconnect).
	pollInterval = 100 * time.Millisecond
	// reconnectTimeout bounds one reconnection attempt after the connection
	// to ovsdb-server is lost.
	reconnectTimeout = 10 * time.Second
)

// errConflict marks a transaction that lost a race with another writer and
// should be rebuilt from the refreshed cache.
var errConflict = errors.New("ovsdb transaction conflict")

// Client is a connection to one OVSDB server holding the Open_vSwitch
// database. It is safe for concurrent use. Create it with Dial and release
// it with Close.
type Client struct {
	ovs     client.Client
	log     *zap.Logger
	changed *broadcaster
	commits *groupcommit.Committer[*pendingTxn]
	names   atomic.Uint64 // suffixes of named UUIDs
}

// Dial connects to the OVSDB server at endpoint, which is in libovsdb form:
// "unix:/var/run/openvswitch/db.sock" or "tcp:127.0.0.1:6640". It starts a
// monitor of the tables the client needs and returns once the initial
// contents are in the cache. After a lost connection the client reconnects
// by itself with exponential backoff; calls made meanwhile block until the
// connection is back or their context ends.
//
// Errors: the endpoint cannot be reached within ctx, or the server does not
// serve the Open_vSwitch database or its schema lacks a needed column.
func Dial(ctx context.Context, endpoint string, log *zap.Logger) (*Client, error) {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("ovsdb_endpoint", endpoint))
	dbModel, err := model.NewClientDBModel(databaseName, map[string]model.Model{
		vswitch.OpenvSwitchTable: &vswitch.OpenvSwitch{},
		vswitch.BridgeTable:      &vswitch.Bridge{},
		vswitch.PortTable:        &vswitch.Port{},
		vswitch.InterfaceTable:   &vswitch.Interface{},
		vswitch.FlowTableTable:   &vswitch.FlowTable{},
	})
	if err != nil {
		return nil, fmt.Errorf("build ovsdb client model: %w", err)
	}
	logger := zapr.NewLogger(log.Named("libovsdb"))
	bo := backoff.NewExponentialBackOff()
	bo.MaxElapsedTime = 0 // keep trying for as long as the client lives
	ovs, err := client.NewOVSDBClient(dbModel,
		client.WithEndpoint(endpoint),
		client.WithLogger(&logger),
		client.WithReconnect(reconnectTimeout, bo),
	)
	if err != nil {
		return nil, fmt.Errorf("create ovsdb client for %s: %w", endpoint, err)
	}
	if err := ovs.Connect(ctx); err != nil {
		return nil, fmt.Errorf("connect to ovsdb at %s: %w", endpoint, err)
	}
	c := &Client{ovs: ovs, log: log, changed: newBroadcaster()}
	c.commits = groupcommit.New(c.commitBatch)
	notify := func(string) { c.changed.notify() }
	ovs.Cache().AddEventHandler(&cache.EventHandlerFuncs{
		AddFunc:    func(table string, _ model.Model) { notify(table) },
		UpdateFunc: func(table string, _, _ model.Model) { notify(table) },
		DeleteFunc: func(table string, _ model.Model) { notify(table) },
	})

	// Monitor only the columns this package reads: Interface rows in
	// particular carry statistics that ovs-vswitchd rewrites every few
	// seconds, which would otherwise flood the cache with updates.
	var (
		root  vswitch.OpenvSwitch
		br    vswitch.Bridge
		port  vswitch.Port
		iface vswitch.Interface
		ft    vswitch.FlowTable
	)
	monitor := ovs.NewMonitor(
		client.WithTable(&root, &root.Bridges, &root.NextCfg, &root.CurCfg, &root.ExternalIDs, &root.OtherConfig),
		client.WithTable(&br, &br.Name, &br.Ports, &br.DatapathType, &br.ExternalIDs, &br.OtherConfig,
			&br.FlowTables, &br.FailMode, &br.Protocols),
		client.WithTable(&port, &port.Name, &port.Interfaces, &port.ExternalIDs),
		client.WithTable(&iface, &iface.Name, &iface.Type, &iface.Options, &iface.ExternalIDs,
			&iface.Ofport, &iface.OfportRequest, &iface.MACInUse, &iface.Error, &iface.MTURequest),
		client.WithTable(&ft, &ft.Name),
	)
	if _, err := ovs.Monitor(ctx, monitor); err != nil {
		ovs.Close()
		return nil, fmt.Errorf("monitor ovsdb tables at %s: %w", endpoint, err)
	}
	log.Debug("ovsdb client ready")
	return c, nil
}

// Close disconnects from the server and stops the cache. The Client must
// not be used afterwards.
func (c *Client) Close() {
	c.ovs.Close()
}

// broadcaster wakes every waiter whenever the cache changes.
type broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcaster() *broadcaster { return &broadcaster{ch: make(chan struct{})} }

// wait returns a channel that is closed at the next notify.
func (b *broadcaster) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcaster) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// waitUntil evaluates cond against the cache each time the cache changes
// (and every pollInterval as a fallback) until it reports done, fails, or
// ctx ends.
func (c *Client) waitUntil(ctx context.Context, what string, cond func() (bool, error)) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		changed := c.changed.wait()
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-changed:
		case <-ticker.C:
		}
	}
}

// uuidName returns a named UUID (RFC 7047 section 5.1, "uuid-name") for a
// row a transaction inserts, unique within the client, so that
// transactions can be merged.
func (c *Client) uuidName(kind string) string {
	return fmt.Sprintf("new_%s_%d", kind, c.names.Add(1))
}

// txn is one transaction under construction.
type txn struct {
	ops []libovsdb.Operation
	// cfgIndex is the index of the select of Open_vSwitch.next_cfg, or -1
	// when the transaction does not ask ovs-vswitchd to reconfigure.
	cfgIndex int
}

// add appends operations produced by a libovsdb API call.
func (t *txn) add(ops []libovsdb.Operation, err error) error {
	if err != nil {
		return err
	}
	t.ops = append(t.ops, ops...)
	return nil
}

// build produces the operations of one attempt from the current cache. A
// nil txn (or one without operations) means there is nothing to change.
type build func(ctx context.Context) (*txn, error)

// transact builds and commits a transaction, rebuilding it from the cache
// when it loses a race, then, when the transaction bumped next_cfg, waits
// for ovs-vswitchd to apply it. A build that returns no operations ends it
// successfully without a transaction.
func (c *Client) transact(ctx context.Context, what string, b build) error {
	var lastErr error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			// Let the cache catch up with whoever won the race.
			wait, cancel := context.WithTimeout(ctx, time.Duration(attempt)*50*time.Millisecond)
			select {
			case <-c.changed.wait():
			case <-wait.Done():
			}
			cancel()
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), lastErr)
			}
		}
		p := &pendingTxn{build: b}
		err := c.commits.Do(ctx, p)
		if errors.Is(err, errConflict) && !p.built {
			lastErr = err
			continue
		}
		if err != nil && !p.built {
			return fmt.Errorf("%s: %w", what, err)
		}
		if p.empty {
			return nil
		}
		nextCfg := p.nextCfg
		if errors.Is(err, errConflict) {
			c.log.Debug("ovsdb transaction lost a race, retrying",
				zap.String("operation", what), zap.Int("attempt", attempt+1), zap.Error(err))
			lastErr = err
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		tr := portTraceFrom(ctx)
		if tr != nil {
			tr.Committed = time.Now()
		}
		if nextCfg > 0 {
			if err := c.waitApplied(ctx, nextCfg); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if tr != nil {
				tr.Applied = time.Now()
			}
		}
		return nil
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", what, maxAttempts, lastErr)
}

// pendingTxn is one transaction waiting to be built and committed together
// with others (group commit): several callers' operations travel in one
// OVSDB transaction with one next_cfg increment, so ovsdb-server and
// ovs-vswitchd handle them once.
type pendingTxn struct {
	build build
	// Outcome: built is set once the build succeeded (an error is then
	// the commit's), empty when it had nothing to change.
	built, empty bool
	nextCfg      int
}

// commitBatch builds every pending transaction from the cache and commits
// them as one; if that fails, each is committed alone, so a conflict or
// bad operation fails only its own caller (who retries as transact does).
func (c *Client) commitBatch(ctx context.Context, batch []*pendingTxn) []error {
	errs := make([]error, len(batch))
	var ts []*txn
	var idx []int
	for i, p := range batch {
		t, err := p.build(ctx)
		if err != nil {
			errs[i] = err
			continue
		}
		p.built = true
		if t == nil || len(t.ops) == 0 {
			p.empty = true
			continue
		}
		ts, idx = append(ts, t), append(idx, i)
	}
	if len(ts) > 1 {
		next, err := c.commit(ctx, merge(ts))
		if err == nil {
			for _, i := range idx {
				batch[i].nextCfg = next
			}
			return errs
		}
		c.log.Debug("shared ovsdb transaction failed; committing its parts one by one",
			zap.Int("parts", len(ts)), zap.Error(err))
	}
	for j, t := range ts {
		batch[idx[j]].nextCfg, errs[idx[j]] = c.commit(ctx, t)
	}
	return errs
}

// merge concatenates transactions into one, with a single next_cfg
// increment and select at the end when any of them asked for one.
func merge(ts []*txn) *txn {
	out := &txn{cfgIndex: -1}
	var reconf []libovsdb.Operation // the first next_cfg increment and select
	for _, t := range ts {
		ops := t.ops
		if t.cfgIndex >= 0 {
			if reconf == nil {
				reconf = ops[t.cfgIndex-1 : t.cfgIndex+1]
			}
			ops = ops[:t.cfgIndex-1]
		}
		out.ops = append(out.ops, ops...)
	}
	if reconf != nil {
		out.ops = append(out.ops, reconf...)
		out.cfgIndex = len(out.ops) - 1
	}
	return out
}

// commit sends the transaction. It returns errConflict (wrapped) when the
// server reports a constraint violation or when an update or mutate matched
// no row, and the new next_cfg value when the transaction selected it.
func (c *Client) commit(ctx context.Context, t *txn) (int, error) {
	results, err := c.ovs.Transact(ctx, t.ops...)
	if err != nil {
		return 0, fmt.Errorf("ovsdb transact: %w", err)
	}
	opErrs, err := libovsdb.CheckOperationResults(results, t.ops)
	if err != nil {
		var conflict bool
		msgs := make([]string, 0, len(opErrs)+1)
		for _, e := range opErrs {
			var cv *libovsdb.ConstraintViolation
			if errors.As(e, &cv) {
				conflict = true
			}
			msgs = append(msgs, describeOpError(e))
		}
		var cv *libovsdb.ConstraintViolation
		if errors.As(err, &cv) {
			conflict = true
		}
		if len(opErrs) == 0 {
			msgs = append(msgs, err.Error())
		}
		detail := strings.Join(msgs, "; ")
		if conflict {
			return 0, fmt.Errorf("%w: %s", errConflict, detail)
		}
		return 0, fmt.Errorf("ovsdb transaction failed: %s", detail)
	}
	for i, op := range t.ops {
		if (op.Op == libovsdb.OperationUpdate || op.Op == libovsdb.OperationMutate) && results[i].Count == 0 {
			return 0, fmt.Errorf("%w: %s on table %s matched no row", errConflict, op.Op, op.Table)
		}
	}
	if t.cfgIndex < 0 {
		return 0, nil
	}
	rows := results[t.cfgIndex].Rows
	if len(rows) != 1 {
		return 0, fmt.Errorf("%w: select of Open_vSwitch.next_cfg returned %d rows", errConflict, len(rows))
	}
	switch v := rows[0]["next_cfg"].(type) {
	case float64:
		return int(v), nil
	case int:
		return v, nil
	default:
		return 0, fmt.Errorf("unexpected type %T of Open_vSwitch.next_cfg", v)
	}
}

// describeOpError names the failed operation and its table next to the
// server's message.
func describeOpError(e libovsdb.OperationError) string {
	if op := e.Operation(); op != nil {
		return fmt.Sprintf("%s on %s: %v", op.Op, op.Table, e)
	}
	return e.Error()
}

// waitApplied waits until ovs-vswitchd has applied configuration number
// cfg, that is Open_vSwitch.cur_cfg >= cfg.
func (c *Client) waitApplied(ctx context.Context, cfg int) error {
	return c.waitUntil(ctx, fmt.Sprintf("ovs-vswitchd to apply configuration %d", cfg), func() (bool, error) {
		root, err := c.root(ctx)
		if err != nil {
			return false, err
		}
		return root.CurCfg >= cfg, nil
	})
}

// root returns the single row of the Open_vSwitch table.
func (c *Client) root(ctx context.Context) (*vswitch.OpenvSwitch, error) {
	var rows []vswitch.OpenvSwitch
	if err := c.ovs.List(ctx, &rows); err != nil {
		return nil, fmt.Errorf("list Open_vSwitch table: %w", err)
	}
	if len(rows) != 1 {
		return nil, fmt.Errorf("Open_vSwitch table has %d rows, want 1 (was the database initialized with `ovs-vsctl init`?)", len(rows))
	}
	return &rows[0], nil
}

// requestReconfigure adds to t the increment of Open_vSwitch.next_cfg and
// a select that reads the new value back, so that transact can wait for
// ovs-vswitchd to catch up. They must be t's last operations.
func (c *Client) requestReconfigure(t *txn, root *vswitch.OpenvSwitch) error {
	if err := t.add(c.ovs.Where(root).Mutate(root, model.Mutation{
		Field: &root.NextCfg, Mutator: libovsdb.MutateOperationAdd, Value: 1,
	})); err != nil {
		return fmt.Errorf("build next_cfg increment: %w", err)
	}
	t.cfgIndex = len(t.ops)
	t.ops = append(t.ops, libovsdb.Operation{
		Op:      libovsdb.OperationSelect,
		Table:   vswitch.OpenvSwitchTable,
		Where:   []libovsdb.Condition{libovsdb.NewCondition("_uuid", libovsdb.ConditionEqual, libovsdb.UUID{GoUUID: root.UUID})},
		Columns: []string{"next_cfg"},
	})
	return nil
}

// bridgeByName returns the cached bridge, or nil when it does not exist.
func (c *Client) bridgeByName(ctx context.Context, name string) (*vswitch.Bridge, error) {
	br := &vswitch.Bridge{Name: name}
	err := c.ovs.Get(ctx, br)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up bridge %q: %w", name, err)
	}
	return br, nil
}

// portByName returns the cached port, or nil when it does not exist.
func (c *Client) portByName(ctx context.Context, name string) (*vswitch.Port, error) {
	p := &vswitch.Port{Name: name}
	err := c.ovs.Get(ctx, p)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up port %q: %w", name, err)
	}
	return p, nil
}

// interfaceByName returns the cached interface, or nil when it does not exist.
func (c *Client) interfaceByName(ctx context.Context, name string) (*vswitch.Interface, error) {
	iface := &vswitch.Interface{Name: name}
	err := c.ovs.Get(ctx, iface)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up interface %q: %w", name, err)
	}
	return iface, nil
}

// bridgeOfPort returns the cached bridge whose ports include portUUID, or nil.
func (c *Client) bridgeOfPort(ctx context.Context, portUUID string) (*vswitch.Bridge, error) {
	var brs []vswitch.Bridge
	err := c.ovs.WhereCache(func(b *vswitch.Bridge) bool {
		for _, p := range b.Ports {
			if p == portUUID {
				return true
			}
		}
		return false
	}).List(ctx, &brs)
	if err != nil {
		return nil, fmt.Errorf("find bridge of port %s: %w", portUUID, err)
	}
	if len(brs) == 0 {
		return nil, nil
	}
	return &brs[0], nil
}

// mergeMapMutations returns the mutations that set the keys of kv in a map
// column while leaving its other keys alone: delete those keys, then insert
// the new pairs (RFC 7047 section 5.1: "insert" never overwrites an
// existing key, and mutations apply in order).
func mergeMapMutations(field *map[string]string, kv map[string]string) []model.Mutation {
	if len(kv) == 0 {
		return nil
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	return []model.Mutation{
		{Field: field, Mutator: libovsdb.MutateOperationDelete, Value: keys},
		{Field: field, Mutator: libovsdb.MutateOperationInsert, Value: kv},
	}
}

// containsAll reports whether have already holds every pair of want.
func containsAll(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// Connected reports whether the client is connected to the server now (it
// reconnects by itself after a loss).
func (c *Client) Connected() bool { return c.ovs.Connected() }

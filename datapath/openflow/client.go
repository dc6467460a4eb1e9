package openflow

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contiv/libOpenflow/common"
	of13 "github.com/contiv/libOpenflow/openflow13"
	"github.com/contiv/libOpenflow/util"
	"go.uber.org/zap"
)

// ErrClosed is returned by Client methods after Close or after the Dial
// context was cancelled.
var ErrClosed = errors.New("openflow client closed")

const (
	tableAll  = 0xff       // OFPTT_ALL
	portAny   = 0xffffffff // OFPP_ANY
	groupAny  = 0xffffffff // OFPG_ANY
	mpReqMore = 1          // OFPMPF_REPLY_MORE
)

// Option configures Dial.
type Option func(*options)

type options struct {
	onReconnect    func(ctx context.Context) error
	echoInterval   time.Duration
	connectTimeout time.Duration
	minBackoff     time.Duration
	maxBackoff     time.Duration
}

// WithOnReconnect sets fn to run after every reconnection, before other
// calls are let through, so the owner can replay its flows (a restarted
// ovs-vswitchd starts with empty tables). Calls made by fn with the ctx it
// is given use the new connection. If fn fails, the connection is dropped
// and the client reconnects and calls fn again, with backoff.
func WithOnReconnect(fn func(ctx context.Context) error) Option {
	return func(o *options) { o.onReconnect = fn }
}

// WithEchoInterval sets how often an echo request is sent (default 5s); the
// connection is considered dead after three intervals without any message
// from the switch. Zero disables keepalive.
func WithEchoInterval(d time.Duration) Option {
	return func(o *options) { o.echoInterval = d }
}

// WithConnectTimeout bounds how long Dial keeps retrying the first
// connection (default 10s), e.g. while the bridge's socket is being created.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout = d }
}

// WithBackoff sets the reconnection backoff bounds (default 100ms to 5s,
// doubling).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.minBackoff, o.maxBackoff = min, max }
}

// Client is an OpenFlow 1.3 connection to one bridge that survives
// ovs-vswitchd restarts. It is safe for concurrent use.
type Client struct {
	target string
	of15   *conn15 // group mods with a selection method
	log    *zap.Logger
	opts   options
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	cur     *conn         // nil while disconnected
	ready   bool          // cur may serve ordinary calls (replay finished)
	closed  bool          //
	changed chan struct{} // closed and replaced on every state change

	packetIns packetInSubs
}

// onPacketIn decodes a packet-in for the subscribers.
func (c *Client) onPacketIn(m message) {
	pi, err := decodePacketIn(m)
	if err != nil {
		c.log.Debug("undecodable packet-in", zap.Error(err))
		return
	}
	c.packetIns.dispatch(pi)
}

// replayKey marks the context handed to the callback set with
// WithOnReconnect; its value
// is the connection being replayed.
type replayKey struct{}

// Dial connects to the bridge's OpenFlow management socket (a unix socket
// path such as /var/run/openvswitch/br-int.mgmt, "unix:PATH" or
// "tcp:HOST:PORT"), negotiates OpenFlow 1.3 (Hello, FeaturesRequest) and
// keeps the session alive with echo requests. The first connection is
// retried with backoff for up to the connect timeout. Afterwards, whenever
// the connection drops, the client reconnects with backoff until ctx is
// cancelled or Close is called, then runs the callback set with
// WithOnReconnect.
func Dial(ctx context.Context, target string, log *zap.Logger, opts ...Option) (*Client, error) {
	if log == nil {
		log = zap.NewNop()
	}
	o := options{
		echoInterval:   5 * time.Second,
		connectTimeout: 10 * time.Second,
		minBackoff:     100 * time.Millisecond,
		maxBackoff:     5 * time.Second,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if _, _, err := parseTarget(target); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	c := &Client{
		target:  target,
		of15:    &conn15{target: target},
		log:     log.With(zap.String("openflow_target", target)),
		opts:    o,
		ctx:     cctx,
		cancel:  cancel,
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	first, err := c.connectInitial()
	if err != nil {
		cancel()
		return nil, err
	}
	c.cur, c.ready = first, true
	go c.supervise(first)
	return c, nil
}

func (c *Client) connectInitial() (*conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.connectTimeout)
	defer cancel()
	backoff := c.opts.minBackoff
	for {
		cn, dpid, err := dialConn(ctx, c.target, c.log, c.opts.echoInterval, c.onPacketIn)
		if err == nil {
			c.log.Info("openflow connected", zap.String("datapath_id", fmt.Sprintf("%016x", dpid)))
			return cn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("openflow: connect to %s: %w", c.target, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.opts.maxBackoff)
	}
}

// supervise waits for the connection to drop and reconnects.
func (c *Client) supervise(cn *conn) {
	defer close(c.done)
	for {
		select {
		case <-cn.closed:
		case <-c.ctx.Done():
			c.shutdown(cn)
			return
		}
		c.log.Warn("openflow connection lost", zap.Error(cn.closeErr))
		c.setState(nil, false)
		next := c.reconnect()
		if next == nil {
			c.shutdown(nil)
			return
		}
		cn = next
	}
}

// reconnect dials with backoff and replays; nil means the client is done.
func (c *Client) reconnect() *conn {
	backoff := c.opts.minBackoff
	for attempt := 1; ; attempt++ {
		select {
		case <-c.ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.opts.maxBackoff)
		cn, dpid, err := dialConn(c.ctx, c.target, c.log, c.opts.echoInterval, c.onPacketIn)
		if err != nil {
			c.log.Debug("openflow reconnect failed", zap.Int("attempt", attempt), zap.Error(err))
			continue
		}
		c.setState(cn, false)
		if fn := c.opts.onReconnect; fn != nil {
			rctx := context.WithValue(c.ctx, replayKey{}, cn)
			if err := fn(rctx); err != nil {
				c.log.Error("openflow replay after reconnect failed; reconnecting", zap.Int("attempt", attempt), zap.Error(err))
				cn.fail(fmt.Errorf("replay failed: %w", err))
				c.setState(nil, false)
				continue
			}
		}
		c.setState(cn, true)
		c.log.Info("openflow reconnected", zap.Int("attempt", attempt), zap.String("datapath_id", fmt.Sprintf("%016x", dpid)))
		return cn
	}
}

func (c *Client) setState(cn *conn, ready bool) {
	c.mu.Lock()
	c.cur, c.ready = cn, ready
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *Client) shutdown(cn *conn) {
	c.mu.Lock()
	c.closed = true
	if c.cur != nil {
		c.cur.fail(ErrClosed)
	}
	c.cur, c.ready = nil, false
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if cn != nil {
		cn.fail(ErrClosed)
	}
}

// Close stops reconnecting and closes the connection. It is idempotent.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	c.of15.mu.Lock()
	c.of15.close()
	c.of15.mu.Unlock()
	return nil
}

// getConn returns the connection to use, waiting while the client is
// reconnecting or replaying.
func (c *Client) getConn(ctx context.Context) (*conn, error) {
	replay, _ := ctx.Value(replayKey{}).(*conn)
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if replay != nil {
			c.mu.Unlock()
			if replay.isClosed() {
				return nil, fmt.Errorf("openflow: %w during replay", errConnClosed)
			}
			return replay, nil
		}
		if c.cur != nil && c.ready {
			cn := c.cur
			c.mu.Unlock()
			return cn, nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("openflow: waiting for connection to %s: %w", c.target, ctx.Err())
		}
	}
}

// Apply sends mods as one ONF bundle (OpenFlow 1.3 extension 230,
// "bundles", with the atomic and ordered flags), commits it and waits for
// the commit reply and a barrier reply. All or nothing: if the switch
// rejects any message, the bundle is discarded and the returned error names
// the offending flow (table, priority, match) and wraps the *OFError with
// the OpenFlow error type and code. Flows that fail local validation are
// reported the same way before anything is sent. An empty mods is a no-op.
//
// Each flow mod travels in its own bundle-add message, so the 64 KiB
// OpenFlow message limit applies per flow, never to the batch: any number
// of mods goes into a single bundle. While the client is reconnecting,
// Apply (like every other method) waits for the connection and the replay
// to finish, bounded by ctx.
func (c *Client) Apply(ctx context.Context, mods []FlowMod) error {
	if len(mods) == 0 {
		return nil
	}
	msgs := make([]ofMessage, len(mods))
	for i := range mods {
		m, err := encodeFlowMod(&mods[i])
		if err != nil {
			return fmt.Errorf("openflow: %s: %w", describeFlowMod(&mods[i]), err)
		}
		msgs[i] = ofMessage{m, &m.Header}
	}
	cn, err := c.getConn(ctx)
	if err != nil {
		return err
	}
	return cn.bundle(ctx, msgs, func(i int) string { return describeFlowMod(&mods[i]) })
}

func describeFlowMod(m *FlowMod) string {
	op := "add"
	if m.Op == OpDelete {
		op = "delete"
	}
	return fmt.Sprintf("%s flow %s", op, m.Flow)
}

// DeleteMatching removes, in all tables, every flow whose cookie satisfies
// flow_cookie & mask == cookie & mask (non-strict OFPFC_DELETE with a
// cookie mask, OpenFlow 1.3 section 6.4), then waits for a barrier reply.
// A zero mask deletes every flow.
func (c *Client) DeleteMatching(ctx context.Context, cookie, mask uint64) error {
	cn, err := c.getConn(ctx)
	if err != nil {
		return err
	}
	fm := of13.NewFlowMod()
	fm.Command = of13.FC_DELETE
	fm.TableId = tableAll
	fm.Cookie = cookie & mask
	fm.CookieMask = mask
	fm.OutPort = portAny
	fm.OutGroup = groupAny
	if err := cn.request(ctx, ofMessage{fm, &fm.Header}); err != nil {
		return fmt.Errorf("openflow: delete flows with cookie %#x/%#x: %w", cookie, mask, err)
	}
	return nil
}

// DumpFlows returns the flows of one table (or all tables when table is
// nil) whose cookie satisfies cookie & cookieMask (a zero mask selects all),
// with their packet and byte counters, read with an OFPMP_FLOW multipart
// request. Table, priority, cookie, counters and the Match fields this
// package encodes are decoded; Actions are not (they stay nil).
func (c *Client) DumpFlows(ctx context.Context, table *uint8, cookie, cookieMask uint64) ([]FlowStats, error) {
	cn, err := c.getConn(ctx)
	if err != nil {
		return nil, err
	}
	body := of13.NewFlowStatsRequest()
	body.TableId = tableAll
	if table != nil {
		body.TableId = *table
	}
	body.Cookie = cookie & cookieMask
	body.CookieMask = cookieMask
	out, err := multipartEntries(ctx, cn, of13.MultipartType_Flow, body, decodeFlowStats)
	if err != nil {
		return nil, fmt.Errorf("openflow: dump flows: %w", err)
	}
	return out, nil
}

// multipart sends a multipart request (OpenFlow 1.3 section 7.3.5) of type
// typ with body and hands the body of every reply part, after its header
// (type(2) flags(2) pad(4)), to part, until the part without
// OFPMPF_REPLY_MORE or an error. An error message from the switch is
// returned as its *OFError; a reply of another type is an error.
func (cn *conn) multipart(ctx context.Context, typ uint16, body util.Message, part func(body []byte) error) error {
	req := &of13.MultipartRequest{Header: of13.NewOfp13Header(), Type: typ, Body: body}
	req.Header.Type = of13.Type_MultiPartRequest
	req.Header.Xid = cn.nextXid()
	w := cn.register(req.Header.Xid)
	defer cn.unregister(req.Header.Xid)
	if err := cn.send(req); err != nil {
		return err
	}
	for {
		m, err := cn.next(ctx, w)
		if err != nil {
			return err
		}
		switch m.typ {
		case of13.Type_Error:
			return decodeError(m)
		case of13.Type_MultiPartReply:
			b := m.body()
			if len(b) < 8 {
				return fmt.Errorf("short multipart reply (%d bytes)", len(m.raw))
			}
			if t := binary.BigEndian.Uint16(b[0:2]); t != typ {
				return fmt.Errorf("multipart reply of type %d, want %d", t, typ)
			}
			if err := part(b[8:]); err != nil {
				return err
			}
			if binary.BigEndian.Uint16(b[2:4])&mpReqMore == 0 {
				return nil
			}
		}
	}
}

// multipartEntries sends a multipart request like multipart and returns
// the entries decode reads from every reply body, in order.
func multipartEntries[T any](ctx context.Context, cn *conn, typ uint16, body util.Message, decode func([]byte) ([]T, error)) ([]T, error) {
	var out []T
	err := cn.multipart(ctx, typ, body, func(b []byte) error {
		entries, err := decode(b)
		out = append(out, entries...)
		return err
	})
	return out, err
}

// ofMessage is a libOpenflow message together with its header, so that
// its xid can be set.
type ofMessage struct {
	util.Message
	hdr *common.Header
}

// request sends msg followed by a barrier and waits for the barrier reply,
// returning the first error the switch reported for msg.
func (cn *conn) request(ctx context.Context, msg ofMessage) error {
	x, bx := cn.nextXid(), cn.nextXid()
	msg.hdr.Xid = x
	w := cn.register(x, bx)
	defer cn.unregister(x, bx)
	if err := cn.send(msg, barrier(bx)); err != nil {
		return err
	}
	var first error
	for {
		m, err := cn.next(ctx, w)
		if err != nil {
			return err
		}
		if m.typ == of13.Type_Error && first == nil {
			first = decodeError(m)
		}
		if m.xid == bx && m.typ == of13.Type_BarrierReply {
			return first
		}
	}
}

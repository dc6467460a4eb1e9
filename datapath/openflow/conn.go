package openflow

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contiv/libOpenflow/common"
	of13 "github.com/contiv/libOpenflow/openflow13"
	"github.com/contiv/libOpenflow/util"
	"go.uber.org/zap"
)

// ofVersion is the OpenFlow wire version this package speaks (1.3).
const ofVersion = 4

// maxMessageLen is the largest OpenFlow message: the header's length field
// is 16 bits (OpenFlow 1.3 section A.1).
const maxMessageLen = 0xffff

// errConnClosed is returned to requests whose connection went away.
var errConnClosed = errors.New("openflow connection closed")

// message is one OpenFlow message as received: its type, transaction id and
// the whole frame, header included.
type message struct {
	typ uint8
	xid uint32
	raw []byte
}

// body is the message without its 8-byte header.
func (m message) body() []byte { return m.raw[8:] }

// waiter collects the messages addressed to a set of transaction ids. The
// reader appends without ever blocking; the requester drains.
type waiter struct {
	mu     sync.Mutex
	msgs   []message
	notify chan struct{}
}

func newWaiter() *waiter { return &waiter{notify: make(chan struct{}, 1)} }

func (w *waiter) push(m message) {
	w.mu.Lock()
	w.msgs = append(w.msgs, m)
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// conn is one live OpenFlow session: a framed reader goroutine that routes
// replies to waiters by xid, answers echo requests, and a keepalive loop.
type conn struct {
	nc  net.Conn
	log *zap.Logger

	wmu sync.Mutex // serialises writes

	mu      sync.Mutex
	waiters map[uint32]*waiter

	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error

	xid      atomic.Uint32
	bundleID atomic.Uint32
	lastRecv atomic.Int64 // unix nanoseconds of the last received message

	// onPacketIn, when set, receives the switch's packet-ins (on the
	// reader goroutine).
	onPacketIn func(message)
}

// dialConn opens target, performs the OpenFlow 1.3 handshake (Hello,
// FeaturesRequest/Reply) within handshakeTimeout and starts the reader and
// keepalive goroutines; the reader hands packet-ins to onPacketIn (if set).
func dialConn(ctx context.Context, target string, log *zap.Logger, echoInterval time.Duration, onPacketIn func(message)) (*conn, uint64, error) {
	network, addr, err := parseTarget(target)
	if err != nil {
		return nil, 0, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, 0, fmt.Errorf("dial %s: %w", target, err)
	}
	c := &conn{
		nc:         nc,
		log:        log,
		waiters:    make(map[uint32]*waiter),
		closed:     make(chan struct{}),
		onPacketIn: onPacketIn,
	}
	// Start xids away from zero so that a zero xid in a reply never matches.
	c.xid.Store(0x1000)
	br := bufio.NewReaderSize(nc, 64<<10)
	dpid, err := c.handshake(ctx, br)
	if err != nil {
		nc.Close()
		return nil, 0, fmt.Errorf("openflow handshake with %s: %w", target, err)
	}
	go c.readLoop(br)
	if echoInterval > 0 {
		go c.keepalive(echoInterval)
	}
	return c, dpid, nil
}

// parseTarget accepts "unix:PATH", "tcp:HOST:PORT" or a bare socket path.
func parseTarget(target string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(target, "unix:"):
		return "unix", strings.TrimPrefix(target, "unix:"), nil
	case strings.HasPrefix(target, "tcp:"):
		return "tcp", strings.TrimPrefix(target, "tcp:"), nil
	case strings.HasPrefix(target, "/") || strings.HasPrefix(target, "."):
		return "unix", target, nil
	}
	return "", "", fmt.Errorf("openflow target %q: want a socket path, unix:PATH or tcp:HOST:PORT", target)
}

const handshakeTimeout = 10 * time.Second

func (c *conn) handshake(ctx context.Context, br *bufio.Reader) (uint64, error) {
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return 0, err
	}
	hello, err := common.NewHello(ofVersion)
	if err != nil {
		return 0, err
	}
	hello.Header.Xid = c.nextXid()
	if err := c.send(hello); err != nil {
		return 0, err
	}
	// Wait for the switch's Hello.
	for {
		m, err := readMessage(br)
		if err != nil {
			return 0, err
		}
		if m.typ == of13.Type_Error {
			return 0, decodeError(m)
		}
		if m.typ != of13.Type_Hello {
			continue
		}
		if err := checkHello(m); err != nil {
			return 0, err
		}
		break
	}
	freq := of13.NewFeaturesRequest()
	freq.Xid = c.nextXid()
	if err := c.send(freq); err != nil {
		return 0, err
	}
	for {
		m, err := readMessage(br)
		if err != nil {
			return 0, err
		}
		switch m.typ {
		case of13.Type_Error:
			return 0, decodeError(m)
		case of13.Type_EchoRequest:
			if err := c.sendEchoReply(m); err != nil {
				return 0, err
			}
		case of13.Type_FeaturesReply:
			if len(m.raw) < 16 {
				return 0, fmt.Errorf("short features reply (%d bytes)", len(m.raw))
			}
			c.lastRecv.Store(time.Now().UnixNano())
			if c.onPacketIn != nil {
				if err := c.enablePacketIns(); err != nil {
					return 0, err
				}
			}
			return binary.BigEndian.Uint64(m.raw[8:16]), c.nc.SetDeadline(time.Time{})
		}
	}
}

// enablePacketIns asks for the packet-ins of output-to-controller actions
// (OFPT_SET_ASYNC, OpenFlow 1.3 section 7.3.10: packet_in_mask bit
// OFPR_ACTION for the master/equal and slave roles; no port-status or
// flow-removed messages). OVS sends a management ("service") connection no
// asynchronous messages until it asks.
func (c *conn) enablePacketIns() error {
	const typeSetAsync, reasonAction = 28, 1
	b := make([]byte, 32)
	b[0], b[1] = ofVersion, typeSetAsync
	binary.BigEndian.PutUint16(b[2:4], uint16(len(b)))
	binary.BigEndian.PutUint32(b[4:8], c.nextXid())
	binary.BigEndian.PutUint32(b[8:12], 1<<reasonAction)
	binary.BigEndian.PutUint32(b[12:16], 1<<reasonAction)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.nc.Write(b); err != nil {
		return fmt.Errorf("set async config: %w", err)
	}
	return nil
}

// checkHello verifies that the switch can speak OpenFlow 1.3: either its
// version bitmap (OpenFlow 1.3 section 7.5.1, OFPHET_VERSIONBITMAP) has bit
// 4 set, or, without a bitmap, its highest version is at least 1.3.
func checkHello(m message) error {
	version := m.raw[0]
	body := m.body()
	for len(body) >= 4 {
		typ := binary.BigEndian.Uint16(body[0:2])
		l := int(binary.BigEndian.Uint16(body[2:4]))
		if l < 4 || l > len(body) {
			break
		}
		if typ == 1 && l >= 8 {
			bitmap := binary.BigEndian.Uint32(body[4:8])
			if bitmap&(1<<ofVersion) == 0 {
				return fmt.Errorf("switch does not allow OpenFlow 1.3 (version bitmap %#x); add OpenFlow13 to the bridge's protocols", bitmap)
			}
			return nil
		}
		padded := (l + 7) / 8 * 8
		if padded > len(body) {
			break
		}
		body = body[padded:]
	}
	if version < ofVersion {
		return fmt.Errorf("switch speaks at most OpenFlow version %d, need 4 (1.3)", version)
	}
	return nil
}

// readMessage reads one length-framed OpenFlow message.
func readMessage(r io.Reader) (message, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return message{}, err
	}
	l := int(binary.BigEndian.Uint16(hdr[2:4]))
	if l < 8 {
		return message{}, fmt.Errorf("bad openflow message length %d", l)
	}
	raw := make([]byte, l)
	copy(raw, hdr[:])
	if _, err := io.ReadFull(r, raw[8:]); err != nil {
		return message{}, err
	}
	return message{typ: hdr[1], xid: binary.BigEndian.Uint32(hdr[4:8]), raw: raw}, nil
}

func (c *conn) nextXid() uint32 { return c.xid.Add(1) }

// send marshals msgs and writes them with one write call.
func (c *conn) send(msgs ...util.Message) error {
	var buf []byte
	for _, m := range msgs {
		b, err := m.MarshalBinary()
		if err != nil {
			return fmt.Errorf("encode openflow message: %w", err)
		}
		if len(b) > maxMessageLen {
			return fmt.Errorf("openflow message of %d bytes exceeds the %d-byte limit", len(b), maxMessageLen)
		}
		buf = append(buf, b...)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.nc.Write(buf); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
		return fmt.Errorf("openflow write: %w", err)
	}
	return nil
}

func (c *conn) sendEchoReply(req message) error {
	reply := make([]byte, len(req.raw))
	copy(reply, req.raw)
	reply[0] = ofVersion
	reply[1] = of13.Type_EchoReply
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(reply)
	return err
}

// readLoop routes every received message to the waiter of its xid until
// the connection fails.
func (c *conn) readLoop(br *bufio.Reader) {
	for {
		m, err := readMessage(br)
		if err != nil {
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
		c.lastRecv.Store(time.Now().UnixNano())
		if m.typ == of13.Type_EchoRequest {
			// Reply from another goroutine: the reader must never block on
			// a write, or a switch that waits for us to read would deadlock.
			go func() { _ = c.sendEchoReply(m) }()
			continue
		}
		if m.typ == of13.Type_PacketIn {
			if c.onPacketIn != nil {
				c.onPacketIn(m)
			}
			continue
		}
		c.mu.Lock()
		w := c.waiters[m.xid]
		c.mu.Unlock()
		if w == nil {
			c.log.Debug("unsolicited openflow message", zap.Uint8("of_type", m.typ), zap.Uint32("xid", m.xid))
			continue
		}
		w.push(m)
	}
}

// keepalive sends an echo request every interval and closes the connection
// when nothing at all was received for three intervals.
func (c *conn) keepalive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.closed:
			return
		case <-t.C:
		}
		idle := time.Since(time.Unix(0, c.lastRecv.Load()))
		if idle > 3*interval {
			c.fail(fmt.Errorf("no message from switch for %s", idle.Round(time.Millisecond)))
			return
		}
		echo := of13.NewEchoRequest()
		echo.Xid = c.nextXid()
		_ = c.send(echo)
	}
}

// fail closes the connection once, recording why.
func (c *conn) fail(err error) {
	c.closeOnce.Do(func() {
		c.closeErr = err
		close(c.closed)
		c.nc.Close()
	})
}

func (c *conn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// register routes the replies to xids to a fresh waiter.
func (c *conn) register(xids ...uint32) *waiter {
	w := newWaiter()
	c.mu.Lock()
	for _, x := range xids {
		c.waiters[x] = w
	}
	c.mu.Unlock()
	return w
}

func (c *conn) unregister(xids ...uint32) {
	c.mu.Lock()
	for _, x := range xids {
		delete(c.waiters, x)
	}
	c.mu.Unlock()
}

// next returns the next message for w, waiting for ctx or connection loss.
func (c *conn) next(ctx context.Context, w *waiter) (message, error) {
	for {
		w.mu.Lock()
		if len(w.msgs) > 0 {
			m := w.msgs[0]
			w.msgs = w.msgs[1:]
			w.mu.Unlock()
			return m, nil
		}
		w.mu.Unlock()
		select {
		case <-w.notify:
		case <-ctx.Done():
			return message{}, ctx.Err()
		case <-c.closed:
			// Drain what arrived before the close.
			w.mu.Lock()
			n := len(w.msgs)
			w.mu.Unlock()
			if n > 0 {
				continue
			}
			return message{}, fmt.Errorf("%w: %v", errConnClosed, c.closeErr)
		}
	}
}

func barrier(xid uint32) *common.Header {
	h := of13.NewOfp13Header()
	h.Type = of13.Type_BarrierRequest
	h.Xid = xid
	return &h
}

package openflow

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// PacketIn is an OFPT_PACKET_IN the switch sent (OpenFlow 1.3 section
// 7.4.1): a packet an Output to PortController sent to the controller.
type PacketIn struct {
	// Table and Cookie identify the flow whose action sent it.
	Table  uint8
	Cookie uint64
	// Reason is the OFPR_* reason (1 OFPR_ACTION for an output action).
	Reason uint8
	// Metadata holds the packet's pipeline fields at the time it was sent,
	// as far as this package decodes them: in_port, registers, tunnel
	// fields, ct_state.
	Metadata Match
	// Data is the packet (whole: Output asks for no buffering).
	Data []byte
}

// packetInSubs fans packet-ins out to subscribers.
type packetInSubs struct {
	mu   sync.Mutex
	next int
	subs map[int]func(PacketIn)
}

func (s *packetInSubs) dispatch(pi PacketIn) {
	s.mu.Lock()
	fns := make([]func(PacketIn), 0, len(s.subs))
	for _, fn := range s.subs {
		fns = append(fns, fn)
	}
	s.mu.Unlock()
	for _, fn := range fns {
		fn(pi)
	}
}

// SubscribePacketIns calls fn with every packet-in the switch sends until
// the returned function is called. fn runs on the connection's reader
// goroutine: it must not block or call back into the Client (hand the
// packet to a buffered channel). Packet-ins sent while the client is
// reconnecting are lost.
func (c *Client) SubscribePacketIns(fn func(PacketIn)) (cancel func()) {
	s := &c.packetIns
	s.mu.Lock()
	if s.subs == nil {
		s.subs = map[int]func(PacketIn){}
	}
	id := s.next
	s.next++
	s.subs[id] = fn
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.subs, id)
		s.mu.Unlock()
	}
}

// decodePacketIn parses an OpenFlow 1.3 OFPT_PACKET_IN: buffer_id,
// total_len, reason, table_id, cookie, an OXM match padded to 8 bytes, two
// bytes of padding, then the packet.
func decodePacketIn(m message) (PacketIn, error) {
	b := m.body()
	if len(b) < 24 {
		return PacketIn{}, fmt.Errorf("short packet-in (%d bytes)", len(m.raw))
	}
	pi := PacketIn{Reason: b[6], Table: b[7], Cookie: binary.BigEndian.Uint64(b[8:16])}
	match := b[16:]
	if binary.BigEndian.Uint16(match[0:2]) != of13.MatchType_OXM {
		return PacketIn{}, fmt.Errorf("packet-in match of type %d, want OXM", binary.BigEndian.Uint16(match[0:2]))
	}
	ml := int(binary.BigEndian.Uint16(match[2:4]))
	padded := (ml + 7) / 8 * 8
	if ml < 4 || padded+2 > len(match) {
		return PacketIn{}, fmt.Errorf("bad packet-in match length %d", ml)
	}
	if err := decodeMatch(match[4:ml], &pi.Metadata); err != nil {
		return PacketIn{}, fmt.Errorf("packet-in match: %w", err)
	}
	pi.Data = cloneBytes(match[padded+2:])
	return pi, nil
}

// PacketOut sends data into the switch as if it had arrived on inPort,
// with actions applied to it (OFPT_PACKET_OUT, OpenFlow 1.3 section
// 7.3.7): e.g. loads of registers followed by Resubmit{Table: 0} run it
// through the whole pipeline. It returns once the switch has processed the
// message (a barrier), with the switch's error if it rejected it.
func (c *Client) PacketOut(ctx context.Context, inPort uint32, actions []Action, data []byte) error {
	acts, err := encodeActionList(actions)
	if err != nil {
		return fmt.Errorf("openflow: packet-out: %w", err)
	}
	po := of13.NewPacketOut()
	po.InPort = inPort
	for _, a := range acts {
		po.AddAction(a)
	}
	po.Data = &rawValue{data}
	cn, err := c.getConn(ctx)
	if err != nil {
		return err
	}
	if err := cn.request(ctx, ofMessage{po, &po.Header}); err != nil {
		return fmt.Errorf("openflow: packet-out on port %d: %w", inPort, err)
	}
	return nil
}

// Connected reports whether the client has a connection to the switch
// that serves calls (connected and, after a reconnection, replayed).
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur != nil && c.ready && !c.closed
}

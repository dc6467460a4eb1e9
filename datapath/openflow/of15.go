package openflow

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// OpenFlow 1.5 is needed for one thing: the selection method of a select
// group (Netronome's experimenter group property, which OVS accepts only in
// OpenFlow 1.5 group mods; OVS Documentation/group-selection-method-
// property.txt). Such group mods travel over a second, minimal connection
// that negotiates OpenFlow 1.5 and sends nothing but group mods and
// barriers; everything else stays on the OpenFlow 1.3 session.

// Selection is a select group's selection method.
type Selection struct {
	// Method is "hash" (OVS hashes Fields when it translates the packet,
	// so every distinct value of Fields gets its own datapath flow) or
	// "dp_hash" (the datapath hashes; Fields must be empty).
	Method string
	// Fields are the hashed fields; absent ones (e.g. UDP ports of a TCP
	// packet) are skipped.
	Fields []HashField
	// Param is the hash basis.
	Param uint64
}

// HashField is a field a selection method may hash, as its OXM header
// (OpenFlow 1.5 section 7.2.3.7; class OFPXMC_OPENFLOW_BASIC, no mask).
type HashField uint32

const (
	HashIPProto HashField = 0x80001401
	HashIPv4Src HashField = 0x80001604
	HashIPv4Dst HashField = 0x80001804
	HashTCPSrc  HashField = 0x80001a02
	HashTCPDst  HashField = 0x80001c02
	HashUDPSrc  HashField = 0x80001e02
	HashUDPDst  HashField = 0x80002002
	HashSCTPSrc HashField = 0x80002202
	HashSCTPDst HashField = 0x80002402
)

const (
	of15Version        = 6
	ofptHello          = 0
	ofptError          = 1
	ofptEchoRequest    = 2
	ofptEchoReply      = 3
	ofptGroupMod       = 15
	ofptBarrierRequest = 20
	ofptBarrierReply   = 21
	ofpg15BucketAll    = 0xffffffff
	ofpgbpt15Weight    = 0
	ofpgpt15Experiment = 0xffff
	ntrVendorID        = 0x0000154d
	ntrtSelectionMeth  = 1
	ntrMaxMethodLen    = 16
)

// needsOF15 reports whether a group mod must be sent as OpenFlow 1.5.
func needsOF15(g *GroupMod) bool {
	return g.Op != GroupOpDelete && g.Group.Selection != nil
}

// encodeGroupMod15 builds an OpenFlow 1.5 OFPT_GROUP_MOD (section 7.3.4.2)
// with xid, including the selection method property.
func encodeGroupMod15(g *GroupMod, xid uint32) ([]byte, error) {
	if g.Group.ID > 0xffffff00 {
		return nil, fmt.Errorf("group id %#x is reserved", g.Group.ID)
	}
	var cmd uint16
	switch g.Op {
	case GroupOpAdd:
		cmd = 0
	case GroupOpModify:
		cmd = 1
	case GroupOpDelete:
		cmd = 2
	default:
		return nil, fmt.Errorf("unknown group op %d", g.Op)
	}
	var buckets []byte
	if g.Op != GroupOpDelete {
		for i, b := range g.Group.Buckets {
			ab, err := encodeActions15(b.Actions)
			if err != nil {
				return nil, fmt.Errorf("bucket %d: %w", i, err)
			}
			bk := make([]byte, 8, 8+len(ab)+8)
			binary.BigEndian.PutUint16(bk[2:4], uint16(len(ab)))
			binary.BigEndian.PutUint32(bk[4:8], uint32(i))
			bk = append(bk, ab...)
			if g.Group.Type == GroupSelect {
				bk = binary.BigEndian.AppendUint16(bk, ofpgbpt15Weight)
				bk = binary.BigEndian.AppendUint16(bk, 8)
				bk = binary.BigEndian.AppendUint16(bk, max(b.Weight, 1))
				bk = append(bk, 0, 0)
			}
			binary.BigEndian.PutUint16(bk[0:2], uint16(len(bk)))
			buckets = append(buckets, bk...)
		}
	}
	var props []byte
	if s := g.Group.Selection; s != nil && g.Op != GroupOpDelete {
		if len(s.Method) >= ntrMaxMethodLen || s.Method == "" {
			return nil, fmt.Errorf("selection method %q: want 1..%d characters", s.Method, ntrMaxMethodLen-1)
		}
		if g.Group.Type != GroupSelect {
			return nil, errors.New("a selection method needs a select group")
		}
		// Each field is a whole OXM TLV without mask whose value is all
		// ones (OVS reads it as the field's hash mask).
		var fields []byte
		for _, f := range s.Fields {
			fields = binary.BigEndian.AppendUint32(fields, uint32(f))
			for i := 0; i < int(uint32(f)&0xff); i++ {
				fields = append(fields, 0xff)
			}
		}
		p := make([]byte, 40, 40+len(fields)+8)
		binary.BigEndian.PutUint16(p[0:2], ofpgpt15Experiment)
		binary.BigEndian.PutUint16(p[2:4], uint16(40+len(fields)))
		binary.BigEndian.PutUint32(p[4:8], ntrVendorID)
		binary.BigEndian.PutUint32(p[8:12], ntrtSelectionMeth)
		copy(p[16:32], s.Method)
		binary.BigEndian.PutUint64(p[32:40], s.Param)
		p = append(p, fields...)
		for len(p)%8 != 0 {
			p = append(p, 0)
		}
		props = p
	}
	n := 8 + 16 + len(buckets) + len(props)
	if n > 0xffff {
		return nil, fmt.Errorf("group mod of %d bytes exceeds the 64 KiB OpenFlow message limit", n)
	}
	m := make([]byte, 24, n)
	m[0], m[1] = of15Version, ofptGroupMod
	binary.BigEndian.PutUint16(m[2:4], uint16(n))
	binary.BigEndian.PutUint32(m[4:8], xid)
	binary.BigEndian.PutUint16(m[8:10], cmd)
	m[10] = uint8(g.Group.Type)
	binary.BigEndian.PutUint32(m[12:16], g.Group.ID)
	binary.BigEndian.PutUint16(m[16:18], uint16(len(buckets)))
	binary.BigEndian.PutUint32(m[20:24], ofpg15BucketAll)
	m = append(m, buckets...)
	return append(m, props...), nil
}

// conn15 is the OpenFlow 1.5 side connection, dialled on first use and
// again after a connection error (an OFError reply keeps it).
type conn15 struct {
	target string
	mu     sync.Mutex
	nc     net.Conn
	xid    uint32
}

func (c *conn15) close() {
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
}

// header15 returns a new OpenFlow 1.5 header.
func header15(typ uint8, length uint16, xid uint32) []byte {
	h := make([]byte, 8)
	h[0], h[1] = of15Version, typ
	binary.BigEndian.PutUint16(h[2:4], length)
	binary.BigEndian.PutUint32(h[4:8], xid)
	return h
}

// dial connects and exchanges Hellos; the switch must agree on 1.5.
func (c *conn15) dial(ctx context.Context) error {
	network, addr, err := parseTarget(c.target)
	if err != nil {
		return err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", c.target, err)
	}
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	if _, err := nc.Write(header15(ofptHello, 8, 1)); err != nil {
		nc.Close()
		return fmt.Errorf("hello: %w", err)
	}
	m, err := readMessage(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("hello: %w", err)
	}
	if m.typ != ofptHello || m.raw[0] < of15Version {
		nc.Close()
		return fmt.Errorf("switch does not speak OpenFlow 1.5 (answered version %d, type %d): "+
			"add OpenFlow15 to the bridge's protocols", m.raw[0], m.typ)
	}
	_ = nc.SetDeadline(time.Time{})
	c.nc, c.xid = nc, 0x100
	return nil
}

// send sends the group mods in order, then a barrier, and returns the
// first error the switch reported (naming the group mod).
func (c *conn15) send(ctx context.Context, mods []GroupMod) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		fresh := c.nc == nil
		if fresh {
			if err := c.dial(ctx); err != nil {
				return fmt.Errorf("openflow 1.5: %w", err)
			}
		}
		err := c.exchange(ctx, mods)
		var ofe *OFError
		if err == nil || errors.As(err, &ofe) {
			return err
		}
		c.close() // connection state unknown: start afresh
		// A connection idle since the switch restarted fails on first
		// use; a fresh one gets one more try (group adds and modifies
		// are idempotent enough: a repeated add fails as "exists").
		if fresh || attempt > 0 {
			return err
		}
	}
}

func (c *conn15) exchange(ctx context.Context, mods []GroupMod) error {
	byXid := map[uint32]int{}
	var out []byte
	for i := range mods {
		c.xid++
		m, err := encodeGroupMod15(&mods[i], c.xid)
		if err != nil {
			return fmt.Errorf("openflow: %s: %w", mods[i].String(), err)
		}
		byXid[c.xid] = i
		out = append(out, m...)
	}
	c.xid++
	bx := c.xid
	out = append(out, header15(ofptBarrierRequest, 8, bx)...)
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.nc.SetDeadline(deadline)
	if _, err := c.nc.Write(out); err != nil {
		return fmt.Errorf("openflow 1.5: write: %w", err)
	}
	var first error
	for {
		m, err := readMessage(c.nc)
		if err != nil {
			return fmt.Errorf("openflow 1.5: read: %w", err)
		}
		switch m.typ {
		case ofptEchoRequest:
			reply := append(header15(ofptEchoReply, uint16(len(m.raw)), m.xid), m.body()...)
			if _, err := c.nc.Write(reply); err != nil {
				return fmt.Errorf("openflow 1.5: echo reply: %w", err)
			}
		case ofptError:
			if i, ok := byXid[m.xid]; ok && first == nil {
				first = fmt.Errorf("openflow: %s: %w", mods[i].String(), decodeError(m))
			}
		case ofptBarrierReply:
			if m.xid == bx {
				return first
			}
		}
	}
}

// encodeActions15 encodes an action list for OpenFlow 1.5. Register loads
// become OFPAT_SET_FIELD with an NXM register field (OVS rejects
// NXAST_REG_LOAD in 1.5); every other action encodes as in 1.3.
func encodeActions15(actions []Action) ([]byte, error) {
	var out []byte
	for _, a := range actions {
		if l, ok := a.(LoadReg); ok {
			out = append(out, setFieldReg15(l)...)
			continue
		}
		acts, err := encodeActionList([]Action{a})
		if err != nil {
			return nil, err
		}
		for _, x := range acts {
			b, err := x.MarshalBinary()
			if err != nil {
				return nil, err
			}
			out = append(out, b...)
		}
	}
	return out, nil
}

// setFieldReg15 is set_field of bits Ofs..Ofs+NBits-1 of register Reg
// (NXM_NX_REGn: class 0x0001, field n), masked unless all 32 bits.
func setFieldReg15(l LoadReg) []byte {
	nbits := uint32(l.NBits)
	if nbits == 0 || nbits > 32 {
		nbits = 32
	}
	mask := uint32(0xffffffff)
	if nbits < 32 {
		mask = (uint32(1)<<nbits - 1) << l.Ofs
	}
	value := (l.Value << l.Ofs) & mask
	hdr := uint32(0x0001)<<16 | uint32(l.Reg)<<9
	var oxm []byte
	if mask == 0xffffffff {
		oxm = binary.BigEndian.AppendUint32(nil, hdr|4)
		oxm = binary.BigEndian.AppendUint32(oxm, value)
	} else {
		oxm = binary.BigEndian.AppendUint32(nil, hdr|1<<8|8)
		oxm = binary.BigEndian.AppendUint32(oxm, value)
		oxm = binary.BigEndian.AppendUint32(oxm, mask)
	}
	n := (4 + len(oxm) + 7) / 8 * 8
	a := make([]byte, 4, n)
	binary.BigEndian.PutUint16(a[0:2], 25) // OFPAT_SET_FIELD
	binary.BigEndian.PutUint16(a[2:4], uint16(n))
	a = append(a, oxm...)
	return append(a, make([]byte, n-len(a))...)
}

package openflow

import (
	"context"
	"encoding/binary"
	"fmt"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// GroupType is an OpenFlow group type (OpenFlow 1.3 section 5.6.1).
type GroupType uint8

const (
	// GroupAll runs every bucket (OFPGT_ALL), e.g. for flooding.
	GroupAll GroupType = of13.OFPGT_ALL
	// GroupSelect runs one bucket chosen by a hash of the packet, weighted
	// by Bucket.Weight (OFPGT_SELECT), e.g. for service load balancing.
	GroupSelect GroupType = of13.OFPGT_SELECT
)

// Bucket is one action list of a group.
type Bucket struct {
	// Weight is the bucket's relative share in a select group; 0 is sent
	// as 1 (the ovs-ofctl default). Ignored for GroupAll.
	Weight  uint16
	Actions []Action // no GotoTable
}

// GroupEntry is one group: its id (0..0xffffff00), type and buckets.
type GroupEntry struct {
	ID      uint32
	Type    GroupType
	Buckets []Bucket
	// Selection, when set, is the select group's selection method; such
	// groups are added and modified over OpenFlow 1.5 (see of15.go).
	Selection *Selection
}

// GroupOp is what a GroupMod does.
type GroupOp int

const (
	// GroupOpAdd creates the group (OFPGC_ADD); it fails if the id exists.
	GroupOpAdd GroupOp = iota
	// GroupOpModify replaces the type and buckets of an existing group
	// (OFPGC_MODIFY).
	GroupOpModify
	// GroupOpDelete removes the group (OFPGC_DELETE) and, as OpenFlow
	// requires, every flow that sends packets to it. Only Group.ID is used.
	GroupOpDelete
)

// GroupMod is one change to the group table.
type GroupMod struct {
	Op    GroupOp
	Group GroupEntry
}

func (g *GroupMod) String() string {
	op := "add"
	switch g.Op {
	case GroupOpModify:
		op = "modify"
	case GroupOpDelete:
		op = "delete"
	}
	return fmt.Sprintf("%s group_id=%d", op, g.Group.ID)
}

func encodeGroupMod(g *GroupMod) (*of13.GroupMod, error) {
	if g.Group.ID > of13.OFPG_MAX {
		return nil, fmt.Errorf("group id %#x is reserved", g.Group.ID)
	}
	m := of13.NewGroupMod()
	m.GroupId = g.Group.ID
	m.Type = uint8(g.Group.Type)
	switch g.Op {
	case GroupOpAdd:
		m.Command = of13.OFPGC_ADD
	case GroupOpModify:
		m.Command = of13.OFPGC_MODIFY
	case GroupOpDelete:
		m.Command = of13.OFPGC_DELETE
		return m, nil
	default:
		return nil, fmt.Errorf("unknown group op %d", g.Op)
	}
	if g.Group.Type != GroupAll && g.Group.Type != GroupSelect {
		return nil, fmt.Errorf("unsupported group type %d", g.Group.Type)
	}
	for i, b := range g.Group.Buckets {
		acts, err := encodeActionList(b.Actions)
		if err != nil {
			return nil, fmt.Errorf("bucket %d: %w", i, err)
		}
		bk := of13.NewBucket()
		if g.Group.Type == GroupSelect {
			bk.Weight = max(b.Weight, 1)
		}
		for _, a := range acts {
			bk.AddAction(a)
		}
		m.AddBucket(*bk)
	}
	return m, nil
}

// ApplyGroups sends group changes as one atomic bundle, like Apply: all or
// nothing, and the error names the offending group and wraps the *OFError.
// A set that holds a group with a selection method is the exception: its
// mods go in order over OpenFlow 1.5, each atomic, the set not.
func (c *Client) ApplyGroups(ctx context.Context, mods []GroupMod) error {
	if len(mods) == 0 {
		return nil
	}
	for i := range mods {
		if needsOF15(&mods[i]) {
			// Sent in order over the 1.5 connection: each group mod is
			// atomic, the set is not.
			return c.of15.send(ctx, mods)
		}
	}
	msgs := make([]ofMessage, len(mods))
	for i := range mods {
		m, err := encodeGroupMod(&mods[i])
		if err != nil {
			return fmt.Errorf("openflow: %s: %w", mods[i].String(), err)
		}
		msgs[i] = ofMessage{m, &m.Header}
	}
	cn, err := c.getConn(ctx)
	if err != nil {
		return err
	}
	return cn.bundle(ctx, msgs, func(i int) string { return mods[i].String() })
}

// GroupIDs returns the IDs of every group on the switch, read with an
// OFPMP_GROUP_DESC multipart request (OpenFlow 1.3 section 7.3.5.11).
func (c *Client) GroupIDs(ctx context.Context) ([]uint32, error) {
	cn, err := c.getConn(ctx)
	if err != nil {
		return nil, err
	}
	out, err := multipartEntries(ctx, cn, of13.MultipartType_GroupDesc, emptyBody{}, decodeGroupDesc)
	if err != nil {
		return nil, fmt.Errorf("openflow: dump groups: %w", err)
	}
	return out, nil
}

// decodeGroupDesc returns the group IDs of one OFPMP_GROUP_DESC reply
// body: entries of length(2) type(1) pad(1) group_id(4) buckets.
func decodeGroupDesc(b []byte) ([]uint32, error) {
	var ids []uint32
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, fmt.Errorf("truncated group desc entry (%d bytes)", len(b))
		}
		l := int(binary.BigEndian.Uint16(b[0:2]))
		if l < 8 || l > len(b) {
			return nil, fmt.Errorf("bad group desc entry length %d", l)
		}
		ids = append(ids, binary.BigEndian.Uint32(b[4:8]))
		b = b[l:]
	}
	return ids, nil
}

// emptyBody is the empty body of a multipart request without parameters.
type emptyBody struct{}

func (emptyBody) Len() uint16                       { return 0 }
func (emptyBody) MarshalBinary() ([]byte, error)    { return nil, nil }
func (emptyBody) UnmarshalBinary(data []byte) error { return nil }

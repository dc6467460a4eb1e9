package openflow

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	of13 "github.com/contiv/libOpenflow/openflow13"
	"github.com/contiv/libOpenflow/util"
)

// bundleFlags asks for an atomic, ordered bundle (ONF extension 230,
// OFPBF_ATOMIC | OFPBF_ORDERED). OVS requires the same flags on every
// control and add message of a bundle.
const bundleFlags = of13.OFPBCT_ATOMIC | of13.OFPBCT_ORDERED

func bundleCtrl(xid, id uint32, typ uint16) util.Message {
	m := of13.NewBundleControl(&of13.BundleControl{BundleID: id, Type: typ, Flags: bundleFlags})
	m.Header.Xid = xid
	return m
}

// bundle runs msgs as one atomic bundle:
//
//  1. open, add every message (each add and its inner message share an xid
//     so that errors map back to the message), barrier;
//  2. if the switch rejected any add, discard and report it;
//  3. otherwise commit, barrier; a failed commit reports the error of the
//     failing message (OVS sends it before OFPBFC_MSG_FAILED).
//
// describe(i) names message i in errors.
func (cn *conn) bundle(ctx context.Context, msgs []ofMessage, describe func(int) string) error {
	id := cn.bundleID.Add(1)
	openX, barrier1 := cn.nextXid(), cn.nextXid()
	finishX, barrier2 := cn.nextXid(), cn.nextXid()
	xids := make([]uint32, len(msgs))
	index := make(map[uint32]int, len(msgs))
	for i := range msgs {
		xids[i] = cn.nextXid()
		index[xids[i]] = i
	}
	all := append([]uint32{openX, barrier1, finishX, barrier2}, xids...)
	w := cn.register(all...)
	defer cn.unregister(all...)

	out := make([]util.Message, 0, len(msgs)+2)
	out = append(out, bundleCtrl(openX, id, of13.OFPBCT_OPEN_REQUEST))
	for i, m := range msgs {
		m.hdr.Xid = xids[i]
		add := of13.NewBundleAdd(&of13.BundleAdd{BundleID: id, Flags: bundleFlags, Message: m.Message})
		add.Header.Xid = xids[i]
		out = append(out, add)
	}
	out = append(out, barrier(barrier1))
	if err := cn.send(out...); err != nil {
		return fmt.Errorf("openflow: send bundle: %w", err)
	}

	// Phase 1: collect the open reply and any add errors up to the barrier.
	var addErr, openErr error
	opened := false
	for done := false; !done; {
		m, err := cn.next(ctx, w)
		if err != nil {
			if !cn.isClosed() {
				_ = cn.send(bundleCtrl(cn.nextXid(), id, of13.OFPBCT_DISCARD_REQUEST))
			}
			return fmt.Errorf("openflow: bundle: %w", err)
		}
		switch {
		case m.typ == of13.Type_Error:
			e := decodeError(m)
			if i, ok := index[m.xid]; ok {
				if addErr == nil {
					addErr = fmt.Errorf("openflow: bundle rejected, nothing applied: %s: %w", describe(i), e)
				}
			} else if openErr == nil {
				openErr = fmt.Errorf("openflow: open bundle: %w", e)
			}
		case m.xid == openX:
			t, err := bundleReplyType(m)
			if err != nil {
				openErr = err
			} else if t == of13.OFPBCT_OPEN_REPLY {
				opened = true
			}
		case m.xid == barrier1 && m.typ == of13.Type_BarrierReply:
			done = true
		}
	}
	if openErr != nil || !opened {
		if openErr == nil {
			openErr = errors.New("openflow: switch did not confirm bundle open")
		}
		return openErr
	}
	finish := uint16(of13.OFPBCT_COMMIT_REQUEST)
	if addErr != nil {
		finish = of13.OFPBCT_DISCARD_REQUEST
	}
	if err := cn.send(bundleCtrl(finishX, id, finish), barrier(barrier2)); err != nil {
		return fmt.Errorf("openflow: finish bundle: %w", err)
	}

	// Phase 2: the commit (or discard) reply, errors, then the barrier.
	var msgErr, finishErr error
	finished := false
	for {
		m, err := cn.next(ctx, w)
		if err != nil {
			return fmt.Errorf("openflow: bundle commit: %w (outcome unknown)", err)
		}
		switch {
		case m.typ == of13.Type_Error:
			e := decodeError(m)
			if i, ok := index[m.xid]; ok {
				if msgErr == nil {
					msgErr = fmt.Errorf("openflow: bundle rejected, nothing applied: %s: %w", describe(i), e)
				}
			} else if finishErr == nil || isBundleMsgFailed(finishErr) {
				finishErr = e
			}
		case m.xid == finishX:
			if _, err := bundleReplyType(m); err == nil {
				finished = true
			}
		case m.xid == barrier2 && m.typ == of13.Type_BarrierReply:
			switch {
			case addErr != nil:
				return addErr
			case msgErr != nil:
				return msgErr
			case finishErr != nil:
				return fmt.Errorf("openflow: bundle commit failed, nothing applied: %w", finishErr)
			case !finished:
				return errors.New("openflow: switch did not confirm bundle commit")
			}
			return nil
		}
	}
}

// bundleReplyType decodes the control type of an ONF bundle control reply
// (experimenter header: 8-byte OpenFlow header, experimenter id, exp_type;
// then bundle_id, type, flags).
func bundleReplyType(m message) (uint16, error) {
	b := m.body()
	if m.typ != of13.Type_Experimenter || len(b) < 14 {
		return 0, fmt.Errorf("openflow: unexpected reply type %d to bundle control", m.typ)
	}
	if binary.BigEndian.Uint32(b[0:4]) != experimenterONF || binary.BigEndian.Uint32(b[4:8]) != of13.Type_BundleCtrl {
		return 0, errors.New("openflow: unexpected experimenter reply to bundle control")
	}
	return binary.BigEndian.Uint16(b[12:14]), nil
}

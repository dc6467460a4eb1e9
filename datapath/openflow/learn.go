package openflow

import (
	"errors"
	"fmt"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// LearnField names a field the learn action can read or write
// (ovs-fields(7) names; RegN via LearnReg).
type LearnField string

// Fields usable in learn specs.
const (
	LearnEthType LearnField = "eth_type"
	LearnIPProto LearnField = "ip_proto"
	LearnIPSrc   LearnField = "ip_src"
	LearnIPDst   LearnField = "ip_dst"
	LearnTCPDst  LearnField = "tcp_dst"
	LearnUDPDst  LearnField = "udp_dst"
	LearnSCTPDst LearnField = "sctp_dst"
)

// LearnReg names register n (0..15) as a learn field.
func LearnReg(n uint8) LearnField { return LearnField(fmt.Sprintf("reg%d", n)) }

func learnFieldID(f LearnField) (fieldID, error) {
	switch f {
	case LearnEthType:
		return fieldID{classNXM0, 3, 2}, nil
	case LearnIPProto:
		return fieldID{classNXM0, 6, 1}, nil
	case LearnIPSrc:
		return nxmOfIPSrc, nil
	case LearnIPDst:
		return nxmOfIPDst, nil
	case LearnTCPDst:
		return fieldID{classNXM0, 10, 2}, nil
	case LearnUDPDst:
		return fieldID{classNXM0, 12, 2}, nil
	case LearnSCTPDst:
		return oxmSCTPDst, nil
	}
	var n uint8
	if _, err := fmt.Sscanf(string(f), "reg%d", &n); err == nil && n <= 15 && string(f) == fmt.Sprintf("reg%d", n) {
		return nxmReg(n), nil
	}
	return fieldID{}, fmt.Errorf("learn: unsupported field %q", f)
}

// LearnSpecKind says what one learn spec adds to the learned flow
// (ovs-actions(7) "learn": field=value, field[], load:value->field,
// load:field->field).
type LearnSpecKind int

const (
	// LearnMatchValue: the learned flow matches Dst = Value.
	LearnMatchValue LearnSpecKind = iota
	// LearnMatchField: the learned flow matches Dst against the current
	// packet's value of Src (usually the same field).
	LearnMatchField
	// LearnLoadValue: the learned flow loads Value into Dst.
	LearnLoadValue
	// LearnLoadField: the learned flow loads the current packet's Src into
	// Dst.
	LearnLoadField
)

// LearnSpec is one spec of a learn action. Src covers the bits [SrcOfs,
// SrcOfs+NBits) of its field, Dst [DstOfs, DstOfs+NBits); NBits 0 means the whole field. Src is
// unused for the *Value kinds, Value for the *Field kinds.
type LearnSpec struct {
	Kind     LearnSpecKind
	Src, Dst LearnField
	SrcOfs   uint8
	DstOfs   uint8
	NBits    uint8
	Value    uint64
}

// Learn adds (or refreshes) a flow in Table built from the current packet
// (ovs-actions(7) "learn"). Timeouts are in seconds, 0 meaning none.
type Learn struct {
	Table       uint8
	Priority    uint16
	IdleTimeout uint16
	HardTimeout uint16
	Cookie      uint64
	Specs       []LearnSpec
}

func (Learn) isAction() {}

func encodeLearn(a Learn) (of13.Action, error) {
	if a.Table == 0xff {
		return nil, errors.New("learn: table 255 is reserved")
	}
	if len(a.Specs) == 0 {
		return nil, errors.New("learn: no specs")
	}
	l := of13.NewNXActionLearn()
	l.TableID = a.Table
	l.Priority = a.Priority
	l.IdleTimeout = a.IdleTimeout
	l.HardTimeout = a.HardTimeout
	l.Cookie = a.Cookie
	for i, s := range a.Specs {
		dst, err := learnFieldID(s.Dst)
		if err != nil {
			return nil, fmt.Errorf("learn spec %d: %w", i, err)
		}
		nbits := uint16(s.NBits)
		if nbits == 0 {
			nbits = uint16(dst.width) * 8
		}
		if uint16(s.DstOfs)+nbits > uint16(dst.width)*8 {
			return nil, fmt.Errorf("learn spec %d: bits [%d,%d) exceed %s", i, s.DstOfs, uint16(s.DstOfs)+nbits, s.Dst)
		}
		spec := &of13.NXLearnSpec{DstField: &of13.NXLearnSpecField{Field: dst.header(), Ofs: uint16(s.DstOfs)}}
		switch s.Kind {
		case LearnMatchValue, LearnLoadValue:
			if nbits < 64 && s.Value>>nbits != 0 {
				return nil, fmt.Errorf("learn spec %d: value %#x does not fit in %d bits", i, s.Value, nbits)
			}
			n := 2 * ((nbits + 15) / 16)
			v := make([]byte, n)
			for j := int(n) - 1; j >= 0 && j >= int(n)-8; j-- {
				v[j] = byte(s.Value >> (8 * (int(n) - 1 - j)))
			}
			spec.SrcValue = v
			if s.Kind == LearnMatchValue {
				spec.Header = of13.NewLearnHeaderMatchFromValue(nbits)
			} else {
				spec.Header = of13.NewLearnHeaderLoadFromValue(nbits)
			}
		case LearnMatchField, LearnLoadField:
			srcName := s.Src
			if srcName == "" {
				srcName = s.Dst
			}
			src, err := learnFieldID(srcName)
			if err != nil {
				return nil, fmt.Errorf("learn spec %d: %w", i, err)
			}
			if uint16(s.SrcOfs)+nbits > uint16(src.width)*8 {
				return nil, fmt.Errorf("learn spec %d: bits [%d,%d) exceed %s", i, s.SrcOfs, uint16(s.SrcOfs)+nbits, srcName)
			}
			spec.SrcField = &of13.NXLearnSpecField{Field: src.header(), Ofs: uint16(s.SrcOfs)}
			if s.Kind == LearnMatchField {
				spec.Header = of13.NewLearnHeaderMatchFromField(nbits)
			} else {
				spec.Header = of13.NewLearnHeaderLoadFromField(nbits)
			}
		default:
			return nil, fmt.Errorf("learn spec %d: unknown kind %d", i, s.Kind)
		}
		l.LearnSpecs = append(l.LearnSpecs, spec)
	}
	return l, nil
}

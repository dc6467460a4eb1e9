package openflow

import (
	"encoding/binary"
	"fmt"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// Experimenter ids that appear in OpenFlow 1.3 experimenter errors.
const (
	experimenterNicira = 0x00002320
	experimenterONF    = 0x4f4e4600
)

// OFError is an OFPT_ERROR message received from the switch (OpenFlow 1.3
// section 7.4.4). For OFPET_EXPERIMENTER (Type 0xffff) errors Code holds the
// experimenter's exp_type and Experimenter its id (0x2320 Nicira,
// 0x4f4e4600 ONF, whose codes 2300..2315 are the bundle errors).
type OFError struct {
	Type         uint16
	Code         uint16
	Experimenter uint32
	// Data is the start of the request that failed, as echoed by the switch.
	Data []byte
}

// Error names the type and code as in the OpenFlow specification.
func (e *OFError) Error() string {
	return fmt.Sprintf("openflow error %s (type %d, code %d)", e.Name(), e.Type, e.Code)
}

// Name is the symbolic name of the error, e.g. "OFPBAC_BAD_OUT_PORT".
func (e *OFError) Name() string {
	if e.Type == 0xffff {
		if e.Experimenter == experimenterONF {
			if n, ok := onfBundleErrors[e.Code]; ok {
				return n
			}
		}
		return fmt.Sprintf("OFPET_EXPERIMENTER(%#x)/%d", e.Experimenter, e.Code)
	}
	t, ok := errorTypes[e.Type]
	if !ok {
		return fmt.Sprintf("OFPET_%d/%d", e.Type, e.Code)
	}
	if codes, ok := errorCodes[e.Type]; ok && int(e.Code) < len(codes) {
		return t.prefix + codes[e.Code]
	}
	return fmt.Sprintf("%s/%d", t.name, e.Code)
}

type errorType struct{ name, prefix string }

// Error types and codes of OpenFlow 1.3 section A.4.4.
var errorTypes = map[uint16]errorType{
	0:  {"OFPET_HELLO_FAILED", "OFPHFC_"},
	1:  {"OFPET_BAD_REQUEST", "OFPBRC_"},
	2:  {"OFPET_BAD_ACTION", "OFPBAC_"},
	3:  {"OFPET_BAD_INSTRUCTION", "OFPBIC_"},
	4:  {"OFPET_BAD_MATCH", "OFPBMC_"},
	5:  {"OFPET_FLOW_MOD_FAILED", "OFPFMFC_"},
	6:  {"OFPET_GROUP_MOD_FAILED", "OFPGMFC_"},
	7:  {"OFPET_PORT_MOD_FAILED", "OFPPMFC_"},
	8:  {"OFPET_TABLE_MOD_FAILED", "OFPTMFC_"},
	9:  {"OFPET_QUEUE_OP_FAILED", "OFPQOFC_"},
	10: {"OFPET_SWITCH_CONFIG_FAILED", "OFPSCFC_"},
	11: {"OFPET_ROLE_REQUEST_FAILED", "OFPRRFC_"},
	12: {"OFPET_METER_MOD_FAILED", "OFPMMFC_"},
	13: {"OFPET_TABLE_FEATURES_FAILED", "OFPTFFC_"},
}

var errorCodes = map[uint16][]string{
	0: {"INCOMPATIBLE", "EPERM"},
	1: {"BAD_VERSION", "BAD_TYPE", "BAD_MULTIPART", "BAD_EXPERIMENTER", "BAD_EXP_TYPE", "EPERM", "BAD_LEN",
		"BUFFER_EMPTY", "BUFFER_UNKNOWN", "BAD_TABLE_ID", "IS_SLAVE", "BAD_PORT", "BAD_PACKET", "MULTIPART_BUFFER_OVERFLOW"},
	2: {"BAD_TYPE", "BAD_LEN", "BAD_EXPERIMENTER", "BAD_EXP_TYPE", "BAD_OUT_PORT", "BAD_ARGUMENT", "EPERM",
		"TOO_MANY", "BAD_QUEUE", "BAD_OUT_GROUP", "MATCH_INCONSISTENT", "UNSUPPORTED_ORDER", "BAD_TAG",
		"BAD_SET_TYPE", "BAD_SET_LEN", "BAD_SET_ARGUMENT"},
	3: {"UNKNOWN_INST", "UNSUP_INST", "BAD_TABLE_ID", "UNSUP_METADATA", "UNSUP_METADATA_MASK",
		"BAD_EXPERIMENTER", "BAD_EXP_TYPE", "BAD_LEN", "EPERM"},
	4: {"BAD_TYPE", "BAD_LEN", "BAD_TAG", "BAD_DL_ADDR_MASK", "BAD_NW_ADDR_MASK", "BAD_WILDCARDS",
		"BAD_FIELD", "BAD_VALUE", "BAD_MASK", "BAD_PREREQ", "DUP_FIELD", "EPERM"},
	5: {"UNKNOWN", "TABLE_FULL", "BAD_TABLE_ID", "OVERLAP", "EPERM", "BAD_TIMEOUT", "BAD_COMMAND", "BAD_FLAGS"},
	6: {"GROUP_EXISTS", "INVALID_GROUP", "WEIGHT_UNSUPPORTED", "OUT_OF_GROUPS", "OUT_OF_BUCKETS",
		"CHAINING_UNSUPPORTED", "WATCH_UNSUPPORTED", "LOOP", "UNKNOWN_GROUP", "CHAINED_GROUP", "BAD_TYPE",
		"BAD_COMMAND", "BAD_BUCKET", "BAD_WATCH", "EPERM"},
	12: {"UNKNOWN", "METER_EXISTS", "INVALID_METER", "UNKNOWN_METER", "BAD_COMMAND", "BAD_FLAGS", "BAD_RATE",
		"BAD_BURST", "BAD_BAND", "BAD_BAND_VALUE", "OUT_OF_METERS", "OUT_OF_BANDS"},
}

// OFPMMFC_METER_EXISTS: an add of a meter id already in use.
const meterExists = 1

// ONF extension 230 (bundles in OpenFlow 1.3) error codes.
var onfBundleErrors = map[uint16]string{
	2300: "OFPBFC_UNKNOWN", 2301: "OFPBFC_EPERM", 2302: "OFPBFC_BAD_ID", 2303: "OFPBFC_BUNDLE_EXIST",
	2304: "OFPBFC_BUNDLE_CLOSED", 2305: "OFPBFC_OUT_OF_BUNDLES", 2306: "OFPBFC_BAD_TYPE",
	2307: "OFPBFC_BAD_FLAGS", 2308: "OFPBFC_MSG_BAD_LEN", 2309: "OFPBFC_MSG_BAD_XID",
	2310: "OFPBFC_MSG_UNSUP", 2311: "OFPBFC_MSG_CONFLICT", 2312: "OFPBFC_MSG_TOO_MANY",
	2313: "OFPBFC_MSG_FAILED", 2314: "OFPBFC_TIMEOUT", 2315: "OFPBFC_BUNDLE_IN_PROGRESS",
}

// decodeError turns an OFPT_ERROR message into an *OFError.
func decodeError(m message) error {
	b := m.body()
	if m.typ != of13.Type_Error || len(b) < 4 {
		return fmt.Errorf("malformed openflow error message (%d bytes)", len(m.raw))
	}
	e := &OFError{Type: binary.BigEndian.Uint16(b[0:2]), Code: binary.BigEndian.Uint16(b[2:4])}
	b = b[4:]
	if e.Type == 0xffff && len(b) >= 4 {
		e.Experimenter = binary.BigEndian.Uint32(b[0:4])
		b = b[4:]
	}
	e.Data = append([]byte(nil), b...)
	return e
}

// isBundleMsgFailed reports the ONF bundle error that only says "one message
// in the bundle failed"; the useful error is the one about that message.
func isBundleMsgFailed(err error) bool {
	e, ok := err.(*OFError)
	return ok && e.Type == 0xffff && e.Experimenter == experimenterONF && e.Code == 2313
}

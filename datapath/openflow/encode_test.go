package openflow

import (
	"encoding/binary"
	"net"
	"strings"
	"testing"
)

// Encoding a match and decoding the resulting OXM TLVs gives the match back.
func TestMatchEncodeDecode(t *testing.T) {
	for _, f := range roundTripFlows() {
		om, err := encodeMatch(&f.Match)
		if err != nil {
			t.Fatalf("encodeMatch(%s): %v", f.Match, err)
		}
		b, err := om.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if len(b)%8 != 0 {
			t.Errorf("match %s: %d bytes, not padded to 8", f.Match, len(b))
		}
		l := int(binary.BigEndian.Uint16(b[2:4]))
		var got Match
		if err := decodeMatch(b[4:l], &got); err != nil {
			t.Fatalf("decodeMatch(%s): %v", f.Match, err)
		}
		if g, w := normMatch(got), normMatch(f.Match); g != w {
			t.Errorf("decoded %s, want %s", g, w)
		}
	}
}

// Prerequisites are encoded before the fields that need them.
func TestMatchFieldOrder(t *testing.T) {
	m := Match{L4Dst: &PortMatch{Port: 80}, IPProto: 6, IPSrc: cidr("10.0.0.1/32"), EthType: 0x0800, InPort: 2}
	om, err := encodeMatch(&m)
	if err != nil {
		t.Fatal(err)
	}
	var order []uint8
	for _, f := range om.Fields {
		order = append(order, f.Field)
	}
	want := []uint8{oxmInPort.field, oxmEthType.field, oxmIPv4Src.field, oxmIPProto.field, oxmTCPDst.field}
	if len(order) != len(want) {
		t.Fatalf("fields %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("fields %v, want %v", order, want)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	cases := []struct {
		name string
		flow Flow
		want string
	}{
		{"goto not last", Flow{Actions: []Action{GotoTable{3}, Output{1}}}, "last action"},
		{"goto backwards", Flow{Table: 5, Actions: []Action{GotoTable{5}}}, "does not go forward"},
		{"port without proto", Flow{Match: Match{EthType: 0x0800, L4Dst: &PortMatch{Port: 1}}}, "IPProto"},
		{"bad register", Flow{Match: Match{Regs: []RegMatch{{Reg: 16}}}}, "reg16"},
		{"duplicate register", Flow{Match: Match{Regs: []RegMatch{{Reg: 1}, {Reg: 1}}}}, "twice"},
		{"ct_state conflict", Flow{Match: Match{CtState: &CtStateMatch{Set: CtNew, Clear: CtNew}}}, "both set and cleared"},
		{"frag without eth_type", Flow{Match: Match{Frag: &FragMatch{Value: FragAny, Mask: FragAny}}}, "EthType"},
		{"frag bad mask", Flow{Match: Match{EthType: 0x0800, Frag: &FragMatch{Value: 4, Mask: 4}}}, "nw_frag mask"},
		{"short mac", Flow{Match: Match{EthSrc: net.HardwareAddr{1, 2}}}, "eth_src"},
		{"v6 arp", Flow{Match: Match{ARPSPA: net.ParseIP("fe80::1")}}, "arp_spa"},
		{"load overflow", Flow{Actions: []Action{LoadReg{Reg: 0, NBits: 4, Value: 16}}}, "does not fit"},
		{"load range", Flow{Actions: []Action{LoadReg{Reg: 0, Ofs: 30, NBits: 4}}}, "exceed"},
		{"move widths", Flow{Actions: []Action{Move{Src: FieldEthSrc, Dst: FieldIPDst}}}, "widths differ"},
		{"move unknown", Flow{Actions: []Action{Move{Src: "tcp_flags", Dst: FieldIPDst}}}, "unsupported source"},
		{"move range too wide", Flow{Actions: []Action{MoveRange{Src: FieldReg(3), Dst: FieldTunID, SrcOfs: 20, NBits: 16}}}, "do not fit"},
		{"mark without commit", Flow{Actions: []Action{CT{SetMark: &Masked32{Value: 1}}}}, "requires commit"},
		{"snat and dnat", Flow{Actions: []Action{CT{NAT: &CTNAT{SNAT: true, DNAT: true}}}}, "exclusive"},
		{"range without kind", Flow{Actions: []Action{CT{NAT: &CTNAT{PortMin: 1}}}}, "needs SNAT or DNAT"},
		{"conjunction clause 0", Flow{Actions: []Action{Conjunction{ID: 1, Clause: 0, NClauses: 2}}}, "clause"},
		{"conjunction one clause", Flow{Actions: []Action{Conjunction{ID: 1, Clause: 1, NClauses: 1}}}, "n_clauses"},
		{"output port 0", Flow{Actions: []Action{Output{0}}}, "port 0"},
		{"nil action", Flow{Actions: []Action{nil}}, "nil action"},
		{"table 255", Flow{Table: 255}, "reserved"},
	}
	for _, tc := range cases {
		_, err := encodeFlowMod(&FlowMod{Op: OpAdd, Flow: tc.flow})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// A flow whose message would pass 64 KiB is refused by name: libOpenflow
// counts lengths in 16 bits, so sent anyway it went out truncated, with
// actions silently missing. 4,080 conjunction actions still fit.
func TestEncodeRefusesOversizedFlows(t *testing.T) {
	flow := func(n int) Flow {
		f := Flow{Table: 5, Priority: 190, Match: Match{EthType: 0x0800, IPProto: 6, L4Dst: &PortMatch{Port: 80}}}
		for i := 0; i < n; i++ {
			f.Actions = append(f.Actions, Conjunction{ID: uint32(i + 1), Clause: 2, NClauses: 3})
		}
		return f
	}
	if _, err := encodeFlowMod(&FlowMod{Op: OpAdd, Flow: flow(4080)}); err != nil {
		t.Errorf("4,080 conjunction actions: %v", err)
	}
	_, err := encodeFlowMod(&FlowMod{Op: OpAdd, Flow: flow(4100)})
	if err == nil || !strings.Contains(err.Error(), "does not fit one OpenFlow message") {
		t.Errorf("4,100 conjunction actions: %v, want an error", err)
	}
	if _, err := encodeFlowMod(&FlowMod{Op: OpDelete, Flow: flow(4100)}); err != nil {
		t.Errorf("deleting it: %v (a delete carries no actions)", err)
	}
}

// Deletes carry no instructions, so invalid actions do not matter there.
func TestDeleteIgnoresActions(t *testing.T) {
	fm, err := encodeFlowMod(&FlowMod{Op: OpDelete, Flow: Flow{Table: 3, Priority: 7, Cookie: 9, Actions: []Action{Output{0}}}})
	if err != nil {
		t.Fatalf("encodeFlowMod(delete): %v", err)
	}
	if fm.Command != 4 || fm.TableId != 3 || fm.Priority != 7 || fm.CookieMask != 0 || len(fm.Instructions) != 0 {
		t.Errorf("delete encoded as command %d table %d priority %d cookie mask %#x, %d instructions",
			fm.Command, fm.TableId, fm.Priority, fm.CookieMask, len(fm.Instructions))
	}
}

func TestMatchString(t *testing.T) {
	m := Match{InPort: PortLocal, EthType: 0x0800, IPProto: 17, L4Dst: &PortMatch{Port: 0x100, Mask: 0xff00},
		Regs: []RegMatch{{Reg: 3, Value: 0x12, Mask: 0xff}}, CtState: &CtStateMatch{Set: CtTrk, Clear: CtInv}}
	want := "in_port=LOCAL,ip,nw_proto=17,udp_dst=0x100/0xff00,reg3=0x12/0xff,ct_state=-inv+trk"
	if got := m.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	frag := Match{EthType: 0x0800, Frag: &FragMatch{Value: FragAny | FragLater, Mask: FragAny | FragLater},
		CtState: &CtStateMatch{Set: CtTrk, Clear: CtInv}}
	if got, want := frag.String(), "ip,nw_frag=later,ct_state=-inv+trk"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (Match{}).String(); got != "any" {
		t.Errorf("empty match String() = %q, want any", got)
	}
}

func TestOFErrorName(t *testing.T) {
	cases := []struct {
		e    OFError
		want string
	}{
		{OFError{Type: 2, Code: 4}, "OFPBAC_BAD_OUT_PORT"},
		{OFError{Type: 4, Code: 9}, "OFPBMC_BAD_PREREQ"},
		{OFError{Type: 6, Code: 0}, "OFPGMFC_GROUP_EXISTS"},
		{OFError{Type: 0xffff, Code: 2313, Experimenter: experimenterONF}, "OFPBFC_MSG_FAILED"},
		{OFError{Type: 5, Code: 99}, "OFPET_FLOW_MOD_FAILED/99"},
		{OFError{Type: 77, Code: 1}, "OFPET_77/1"},
	}
	for _, tc := range cases {
		if got := tc.e.Name(); got != tc.want {
			t.Errorf("%+v: Name() = %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestCheckHello(t *testing.T) {
	hello := func(version uint8, bitmap uint32, withBitmap bool) message {
		raw := []byte{version, 0, 0, 8, 0, 0, 0, 1}
		if withBitmap {
			raw = append(raw, 0, 1, 0, 8)
			raw = binary.BigEndian.AppendUint32(raw, bitmap)
		}
		binary.BigEndian.PutUint16(raw[2:4], uint16(len(raw)))
		return message{typ: 0, raw: raw}
	}
	if err := checkHello(hello(6, 1<<1|1<<4|1<<6, true)); err != nil {
		t.Errorf("OF1.0+1.3+1.5 bitmap rejected: %v", err)
	}
	if err := checkHello(hello(6, 1<<1|1<<6, true)); err == nil {
		t.Error("bitmap without OF1.3 accepted")
	}
	if err := checkHello(hello(4, 0, false)); err != nil {
		t.Errorf("plain OF1.3 hello rejected: %v", err)
	}
	if err := checkHello(hello(1, 0, false)); err == nil {
		t.Error("OF1.0-only hello accepted")
	}
}

func TestParseTarget(t *testing.T) {
	cases := map[string][2]string{
		"/var/run/openvswitch/br-int.mgmt":      {"unix", "/var/run/openvswitch/br-int.mgmt"},
		"unix:/var/run/openvswitch/br-int.mgmt": {"unix", "/var/run/openvswitch/br-int.mgmt"},
		"tcp:127.0.0.1:6653":                    {"tcp", "127.0.0.1:6653"},
	}
	for in, want := range cases {
		n, a, err := parseTarget(in)
		if err != nil || n != want[0] || a != want[1] {
			t.Errorf("parseTarget(%q) = %q, %q, %v; want %q, %q", in, n, a, err, want[0], want[1])
		}
	}
	if _, _, err := parseTarget("br-int"); err == nil {
		t.Error("parseTarget accepted a bare bridge name")
	}
}

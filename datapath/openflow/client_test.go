package openflow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seine-net/seine/datapath/ovstest"
	"go.uber.org/zap/zaptest"
)

// startBridge starts a private OVS with a secure netdev bridge br-int and
// returns it with the bridge's management socket.
func startBridge(tb testing.TB) (*ovstest.OVS, string) {
	tb.Helper()
	o := ovstest.Start(tb)
	o.Run("ovs-vsctl", "add-br", "br-int", "--", "set", "bridge", "br-int",
		"datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow10,OpenFlow13,OpenFlow15")
	sock := o.MgmtSocket("br-int")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return o, sock
		}
		if time.Now().After(deadline) {
			tb.Fatalf("management socket %s did not appear", sock)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dial(tb testing.TB, sock string, opts ...Option) *Client {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	c, err := Dial(ctx, sock, zaptest.NewLogger(tb), opts...)
	if err != nil {
		tb.Fatalf("Dial: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func hw(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func ptr[T any](v T) *T { return &v }

// ofctlFlows returns the dump-flows lines (without counters) of the bridge.
func ofctlFlows(tb testing.TB, o *ovstest.OVS, sock string) []string {
	tb.Helper()
	out := o.Run("ovs-ofctl", "-O", "OpenFlow15", "--no-stats", "dump-flows", sock)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = strings.TrimSpace(l)
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// roundTripFlows covers every Match field and every Action type.
func roundTripFlows() []Flow {
	return []Flow{
		{Table: 0, Priority: 100, Cookie: 0x1001, Match: Match{
			InPort: 1, EthSrc: hw("02:00:00:00:00:01"), EthDst: hw("02:00:00:00:00:02"), EthType: 0x0800,
			IPSrc: cidr("10.0.0.0/24"), IPDst: cidr("10.0.1.5/32"), IPProto: 6,
			L4Src: &PortMatch{Port: 0x3e0, Mask: 0xfff0}, L4Dst: &PortMatch{Port: 80},
		}, Actions: []Action{
			SetEthSrc{hw("02:00:00:00:00:0a")}, SetEthDst{hw("02:00:00:00:00:0b")}, DecTTL{},
			LoadReg{Reg: 0, Ofs: 0, NBits: 4, Value: 3}, GotoTable{20},
		}},
		{Table: 0, Priority: 200, Cookie: 0x1002, Match: Match{
			EthType: 0x0806, ARPOp: 1, ARPSPA: net.ParseIP("10.0.0.1"), ARPTPA: net.ParseIP("10.0.0.254"),
			ARPSHA: hw("02:00:00:00:00:01"),
		}, Actions: []Action{
			Move{Src: FieldEthSrc, Dst: FieldEthDst}, SetEthSrc{hw("02:00:00:00:00:fe")}, SetARPOp{2},
			Move{Src: FieldARPSHA, Dst: FieldARPTHA}, SetARPSHA{hw("02:00:00:00:00:fe")},
			Move{Src: FieldARPSPA, Dst: FieldARPTPA}, SetARPSPA{net.ParseIP("10.0.0.254")},
			Output{PortInPort},
		}},
		{Table: 10, Priority: 300, Cookie: 0x2001, Match: Match{
			EthType: 0x0800, IPProto: 17, L4Dst: &PortMatch{Port: 53}, TunDst: net.ParseIP("198.18.0.11"),
			Regs:    []RegMatch{{Reg: 1, Value: 5}, {Reg: 15, Value: 0x10, Mask: 0xf0}},
			PktMark: &Masked32{Value: 1, Mask: 1},
		}, Actions: []Action{SetTunDst{net.ParseIP("198.18.0.12")}, Output{2}}},
		{Table: 20, Priority: 100, Cookie: 0x3001, Match: Match{
			EthType: 0x0800, CtState: &CtStateMatch{Set: CtTrk | CtEst, Clear: CtNew},
			CtZone: ptr(uint16(65520)), CtMark: &Masked32{Value: 1, Mask: 1},
		}, Actions: []Action{CT{Commit: true, Zone: 65520, SetMark: &Masked32{Value: 1}}, Output{3}}},
		{Table: 20, Priority: 60, Cookie: 0x3004, Match: Match{
			EthType: 0x0800, IPProto: 17, Frag: &FragMatch{Value: FragAny, Mask: FragAny},
			CtState: &CtStateMatch{Set: CtTrk | CtNew},
		}, Actions: []Action{Output{3}}},
		{Table: 20, Priority: 50, Cookie: 0x3002, Match: Match{
			EthType: 0x0800, CtState: &CtStateMatch{Clear: CtTrk},
		}, Actions: []Action{CT{Zone: 65520, Table: ptr(uint8(30)), NAT: &CTNAT{}}}},
		{Table: 30, Priority: 100, Cookie: 0x3003, Match: Match{EthType: 0x0800}, Actions: []Action{
			CT{Commit: true, Zone: 1, NAT: &CTNAT{SNAT: true, IPMin: net.ParseIP("10.0.0.1"), IPMax: net.ParseIP("10.0.0.2"), PortMin: 1000, PortMax: 2000}},
			CT{Commit: true, Zone: 2, SetMark: &Masked32{Value: 0x20, Mask: 0xf0}, NAT: &CTNAT{DNAT: true, IPMin: net.ParseIP("10.96.0.10")}},
			CT{Commit: true, Zone: 3, SetMark: &Masked32{Value: 0x48, Mask: 0x4c}},
		}},
		{Table: 40, Priority: 100, Cookie: 0x4001, Match: Match{EthType: 0x0800, IPSrc: cidr("10.1.0.0/16")},
			Actions: []Action{Conjunction{ID: 7, Clause: 1, NClauses: 2}}},
		{Table: 40, Priority: 100, Cookie: 0x4002, Match: Match{EthType: 0x0800, IPProto: 6, L4Dst: &PortMatch{Port: 443}},
			Actions: []Action{Conjunction{ID: 7, Clause: 2, NClauses: 2}}},
		{Table: 40, Priority: 10, Cookie: 0x4003, Match: Match{EthType: 0x0800, ConjID: ptr(uint32(7))},
			Actions: []Action{Resubmit{50}, OutputReg{Reg: 1, Ofs: 0, NBits: 16}}},
		{Table: 50, Priority: 100, Cookie: 0x5001, Match: Match{EthType: 0x0800, IPProto: 132, L4Src: &PortMatch{Port: 9}},
			Actions: []Action{SetIPSrc{net.ParseIP("10.0.0.9")}, SetIPDst{net.ParseIP("10.0.0.10")}, Group{1}}},
		{Table: 50, Priority: 1, Cookie: 0x5002, Match: Match{}, Actions: nil},
		{Table: 60, Priority: 0, Cookie: 0x6001, Match: Match{InPort: PortLocal}, Actions: []Action{Output{PortNormal}}},
	}
}

func adds(flows []Flow) []FlowMod {
	mods := make([]FlowMod, len(flows))
	for i, f := range flows {
		mods[i] = FlowMod{Op: OpAdd, Flow: f}
	}
	return mods
}

func TestApplyRoundTrip(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)

	// Flow 9 outputs to group 1, which must exist first.
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: GroupEntry{ID: 1, Type: GroupSelect, Buckets: []Bucket{
		{Weight: 10, Actions: []Action{Output{4}}},
		{Weight: 20, Actions: []Action{SetEthDst{hw("02:00:00:00:00:05")}, Output{5}}},
	}}}}); err != nil {
		t.Fatalf("ApplyGroups: %v", err)
	}
	groups := o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock)
	for _, want := range []string{"group_id=1,type=select", "weight:10,actions=output:4", "weight:20,actions=set_field:02:00:00:00:00:05->eth_dst,output:5"} {
		if !strings.Contains(groups, want) {
			t.Errorf("dump-groups lacks %q:\n%s", want, groups)
		}
	}

	flows := roundTripFlows()
	if err := c.Apply(ctx, adds(flows)); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	lines := ofctlFlows(t, o, sock)
	dump := strings.Join(lines, "\n")
	if len(lines) != len(flows) {
		t.Fatalf("ovs-ofctl shows %d flows, want %d:\n%s", len(lines), len(flows), dump)
	}
	// One expected fragment list per flow, in ovs-ofctl's notation.
	want := map[uint64][]string{
		// OVS 3.1 prints reg_load as the equivalent set_field, and omits table=0.
		0x1001: {"priority=100", "tcp", "in_port=1", "dl_src=02:00:00:00:00:01", "dl_dst=02:00:00:00:00:02",
			"nw_src=10.0.0.0/24", "nw_dst=10.0.1.5", "tp_src=0x3e0/0xfff0", "tp_dst=80",
			"actions=set_field:02:00:00:00:00:0a->eth_src,set_field:02:00:00:00:00:0b->eth_dst,dec_ttl,set_field:0x3/0xf->reg0,goto_table:20"},
		0x1002: {"priority=200", "arp", "arp_spa=10.0.0.1", "arp_tpa=10.0.0.254", "arp_op=1", "arp_sha=02:00:00:00:00:01",
			"actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:02:00:00:00:00:fe->eth_src,set_field:2->arp_op," +
				"move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],set_field:02:00:00:00:00:fe->arp_sha," +
				"move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],set_field:10.0.0.254->arp_spa,IN_PORT"},
		0x2001: {"table=10", "priority=300", "udp", "tun_dst=198.18.0.11", "reg1=0x5", "reg15=0x10/0xf0", "pkt_mark=0x1/0x1", "tp_dst=53",
			"actions=set_field:198.18.0.12->tun_dst,output:2"},
		0x3001: {"table=20", "ct_state=-new+est+trk", "ct_zone=65520", "ct_mark=0x1/0x1", "ip",
			"actions=ct(commit,zone=65520,exec(set_field:0x1->ct_mark)),output:3"},
		0x3002: {"table=20", "priority=50", "ct_state=-trk", "actions=ct(table=30,zone=65520,nat)"},
		0x3004: {"table=20", "priority=60", "ct_state=+new+trk", "udp", "nw_frag=yes", "actions=output:3"},
		0x3003: {"table=30", "actions=ct(commit,zone=1,nat(src=10.0.0.1-10.0.0.2:1000-2000)),ct(commit,zone=2,nat(dst=10.96.0.10),exec(set_field:0x20/0xf0->ct_mark)),ct(commit,zone=3,exec(set_field:0x8/0xc->ct_mark,set_field:0x40/0x40->ct_mark))"},
		0x4001: {"table=40", "nw_src=10.1.0.0/16", "actions=conjunction(7,1/2)"},
		0x4002: {"table=40", "tp_dst=443", "actions=conjunction(7,2/2)"},
		0x4003: {"table=40", "priority=10", "conj_id=7", "actions=resubmit(,50),output:NXM_NX_REG1[0..15]"},
		0x5001: {"table=50", "sctp", "tp_src=9", "actions=set_field:10.0.0.9->ip_src,set_field:10.0.0.10->ip_dst,group:1"},
		0x5002: {"table=50", "priority=1", "actions=drop"},
		0x6001: {"table=60", "priority=0", "in_port=LOCAL", "actions=NORMAL"},
	}
	cookieRE := regexp.MustCompile(`cookie=(0x[0-9a-f]+)`)
	seen := map[string]bool{}
	for _, l := range lines {
		m := cookieRE.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("flow without cookie: %s", l)
			continue
		}
		seen[m[1]] = true
		var cookie uint64
		for _, ch := range m[1][2:] {
			cookie = cookie*16 + uint64(strings.IndexRune("0123456789abcdef", ch))
		}
		frags, ok := want[cookie]
		if !ok {
			t.Errorf("unexpected flow %s", l)
			continue
		}
		for _, f := range frags {
			if !strings.Contains(l, f) {
				t.Errorf("flow with cookie %#x lacks %q:\n%s", cookie, f, l)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("saw %d distinct cookies, want %d:\n%s", len(seen), len(want), dump)
	}

	// DumpFlows reads back the same flows: tables, priorities, cookies and
	// the decoded match fields.
	got, err := c.DumpFlows(ctx, nil, 0, 0)
	if err != nil {
		t.Fatalf("DumpFlows: %v", err)
	}
	if len(got) != len(flows) {
		t.Fatalf("DumpFlows returned %d flows, want %d", len(got), len(flows))
	}
	byCookie := map[uint64]FlowStats{}
	for _, fs := range got {
		byCookie[fs.Cookie] = fs
		if fs.Packets != 0 || fs.Bytes != 0 {
			t.Errorf("flow %s: counters %d/%d on an idle bridge", fs.Flow, fs.Packets, fs.Bytes)
		}
	}
	for _, f := range flows {
		fs, ok := byCookie[f.Cookie]
		if !ok {
			t.Errorf("DumpFlows lacks cookie %#x", f.Cookie)
			continue
		}
		if fs.Table != f.Table || fs.Priority != f.Priority {
			t.Errorf("cookie %#x: table/priority %d/%d, want %d/%d", f.Cookie, fs.Table, fs.Priority, f.Table, f.Priority)
		}
		if gotM, wantM := normMatch(fs.Match), normMatch(f.Match); gotM != wantM {
			t.Errorf("cookie %#x: decoded match\n  %s\nwant\n  %s", f.Cookie, gotM, wantM)
		}
	}

	// Table filter and cookie filter.
	t20, err := c.DumpFlows(ctx, ptr(uint8(20)), 0, 0)
	if err != nil {
		t.Fatalf("DumpFlows(table 20): %v", err)
	}
	if len(t20) != 3 || t20[0].Table != 20 || t20[1].Table != 20 || t20[2].Table != 20 {
		t.Errorf("DumpFlows(table 20) = %v, want the 3 flows of table 20", t20)
	}
	c3, err := c.DumpFlows(ctx, nil, 0x3000, 0xf000)
	if err != nil {
		t.Fatalf("DumpFlows(cookie 0x3000/0xf000): %v", err)
	}
	if len(c3) != 4 {
		t.Errorf("DumpFlows(cookie 0x3000/0xf000) returned %d flows, want 4", len(c3))
	}
}

// normMatch renders a match with registers sorted, for comparison.
func normMatch(m Match) string {
	regs := append([]RegMatch(nil), m.Regs...)
	sort.Slice(regs, func(i, j int) bool { return regs[i].Reg < regs[j].Reg })
	m.Regs = regs
	return m.String()
}

func TestPacketCounters(t *testing.T) {
	o, sock := startBridge(t)
	o.Run("ovs-vsctl", "add-port", "br-int", "p1", "--", "set", "interface", "p1", "type=internal", "ofport_request=1")
	c := dial(t, sock)
	ctx := testCtx(t)
	if err := c.Apply(ctx, adds([]Flow{
		{Table: 0, Priority: 10, Cookie: 0xc0, Match: Match{InPort: 1}, Actions: []Action{GotoTable{5}}},
		{Table: 5, Priority: 10, Cookie: 0xc5, Match: Match{}, Actions: nil},
	})); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	// A packet-out through the pipeline (OFPP_TABLE) hits both flows.
	pkt := "ffffffffffff020000000001080045000014000100004001f97d0a0000010a000002"
	o.Run("ovs-ofctl", "-O", "OpenFlow13", "packet-out", sock, "in_port=1 packet="+pkt+" actions=table")
	var got []FlowStats
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		got, err = c.DumpFlows(ctx, nil, 0, 0)
		if err != nil {
			t.Fatalf("DumpFlows: %v", err)
		}
		if len(got) == 2 && got[0].Packets == 1 && got[1].Packets == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters did not reach 1 packet per flow: %+v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, fs := range got {
		if fs.Bytes != uint64(len(pkt)/2) {
			t.Errorf("flow %s: %d bytes, want %d", fs.Flow, fs.Bytes, len(pkt)/2)
		}
	}
}

func TestApplyIsAtomic(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	good := []Flow{
		{Table: 0, Priority: 10, Cookie: 0xa1, Match: Match{InPort: 1}, Actions: []Action{Output{2}}},
		{Table: 0, Priority: 10, Cookie: 0xa2, Match: Match{InPort: 2}, Actions: []Action{Output{1}}},
	}
	cases := []struct {
		name     string
		bad      Flow
		wantErr  []string
		wantOFPE string // name of the OpenFlow error, when the switch rejects
	}{
		{
			name:    "goto lower table (local check)",
			bad:     Flow{Table: 30, Priority: 7, Match: Match{InPort: 3}, Actions: []Action{GotoTable{10}}},
			wantErr: []string{"table=30", "priority=7", "in_port=3", "goto_table:10"},
		},
		{
			name:    "output to port 0 (local check)",
			bad:     Flow{Table: 1, Priority: 8, Match: Match{InPort: 4}, Actions: []Action{Output{0}}},
			wantErr: []string{"table=1", "priority=8", "in_port=4", "port 0"},
		},
		{
			name:     "missing prerequisite (switch rejects at add)",
			bad:      Flow{Table: 3, Priority: 9, Match: Match{IPSrc: cidr("10.0.0.0/8")}, Actions: []Action{Output{1}}},
			wantErr:  []string{"table=3", "priority=9", "nw_src=10.0.0.0/8", "OFPBMC_BAD_PREREQ"},
			wantOFPE: "OFPBMC_BAD_PREREQ",
		},
		{
			name:     "unknown group (switch rejects at add)",
			bad:      Flow{Table: 4, Priority: 11, Match: Match{InPort: 9}, Actions: []Action{Group{99}}},
			wantErr:  []string{"table=4", "priority=11", "in_port=9", "OFPBAC_BAD_OUT_GROUP"},
			wantOFPE: "OFPBAC_BAD_OUT_GROUP",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mods := adds(append(append([]Flow(nil), good...), tc.bad))
			err := c.Apply(ctx, mods)
			if err == nil {
				t.Fatal("Apply succeeded with an invalid flow")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.wantOFPE != "" {
				var oe *OFError
				if !errors.As(err, &oe) || oe.Name() != tc.wantOFPE {
					t.Errorf("error %v does not wrap OFError %s", err, tc.wantOFPE)
				}
			}
			if lines := ofctlFlows(t, o, sock); len(lines) != 0 {
				t.Errorf("failed bundle left flows behind:\n%s", strings.Join(lines, "\n"))
			}
		})
	}

	// A conflict only detectable when the bundle executes: the same group
	// added twice. Nothing of the bundle may remain.
	t.Run("commit-time failure", func(t *testing.T) {
		g := GroupEntry{ID: 5, Type: GroupAll, Buckets: []Bucket{{Actions: []Action{Output{1}}}}}
		err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: GroupEntry{ID: 4, Type: GroupAll}}, {Op: GroupOpAdd, Group: g}, {Op: GroupOpAdd, Group: g}})
		var oe *OFError
		if err == nil || !errors.As(err, &oe) || oe.Name() != "OFPGMFC_GROUP_EXISTS" || !strings.Contains(err.Error(), "group_id=5") {
			t.Fatalf("ApplyGroups(duplicate) error = %v, want OFPGMFC_GROUP_EXISTS naming group_id=5", err)
		}
		if out := o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock); strings.Contains(out, "group_id=") {
			t.Errorf("failed group bundle left groups behind:\n%s", out)
		}
	})

	// The connection is still usable and the good flows apply on their own.
	if err := c.Apply(ctx, adds(good)); err != nil {
		t.Fatalf("Apply(good): %v", err)
	}
	if lines := ofctlFlows(t, o, sock); len(lines) != 2 {
		t.Fatalf("want 2 flows, got:\n%s", strings.Join(lines, "\n"))
	}
}

func TestDelete(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	var flows []Flow
	for i := uint32(1); i <= 6; i++ {
		cookie := uint64(0x1000_0000_0000_0000) | uint64(i)
		if i > 3 {
			cookie = 0x2000_0000_0000_0000 | uint64(i)
		}
		flows = append(flows, Flow{Table: uint8(i % 2), Priority: 100, Cookie: cookie,
			Match: Match{InPort: i, EthType: 0x0800, IPDst: cidr("10.0.0.0/24")}, Actions: []Action{Output{7}}})
	}
	if err := c.Apply(ctx, adds(flows)); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	// Strict delete of flow 2: only it goes, even though flow 2's match
	// is a superset-free sibling of the others.
	if err := c.Apply(ctx, []FlowMod{{Op: OpDelete, Flow: Flow{Table: flows[1].Table, Priority: 100, Match: flows[1].Match}}}); err != nil {
		t.Fatalf("Apply(delete): %v", err)
	}
	// A strict delete with a different priority removes nothing.
	if err := c.Apply(ctx, []FlowMod{{Op: OpDelete, Flow: Flow{Table: flows[0].Table, Priority: 99, Match: flows[0].Match}}}); err != nil {
		t.Fatalf("Apply(delete other priority): %v", err)
	}
	got := cookies(t, c)
	if want := []uint64{0x1000000000000001, 0x1000000000000003, 0x2000000000000004, 0x2000000000000005, 0x2000000000000006}; !equal(got, want) {
		t.Fatalf("after strict delete cookies = %#x, want %#x", got, want)
	}

	if err := c.DeleteMatching(ctx, 0x2000_0000_0000_0000, 0xf000_0000_0000_0000); err != nil {
		t.Fatalf("DeleteMatching: %v", err)
	}
	got = cookies(t, c)
	if want := []uint64{0x1000000000000001, 0x1000000000000003}; !equal(got, want) {
		t.Fatalf("after DeleteMatching cookies = %#x, want %#x", got, want)
	}
	if n := len(ofctlFlows(t, o, sock)); n != 2 {
		t.Fatalf("ovs-ofctl shows %d flows, want 2", n)
	}
}

func cookies(t *testing.T, c *Client) []uint64 {
	t.Helper()
	fs, err := c.DumpFlows(testCtx(t), nil, 0, 0)
	if err != nil {
		t.Fatalf("DumpFlows: %v", err)
	}
	var out []uint64
	for _, f := range fs {
		out = append(out, f.Cookie)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestGroupsModifyDelete(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	g := GroupEntry{ID: 10, Type: GroupSelect, Buckets: []Bucket{{Actions: []Action{Output{1}}}}}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: g}}); err != nil {
		t.Fatalf("add: %v", err)
	}
	g.Buckets = append(g.Buckets, Bucket{Weight: 3, Actions: []Action{LoadReg{Reg: 2, Value: 9}, Resubmit{10}}})
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpModify, Group: g}}); err != nil {
		t.Fatalf("modify: %v", err)
	}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: GroupEntry{ID: 0x1000007, Type: GroupSelect}}}); err != nil {
		t.Fatalf("add: %v", err)
	}
	ids, err := c.GroupIDs(ctx)
	slices.Sort(ids)
	if err != nil || fmt.Sprint(ids) != "[10 16777223]" {
		t.Fatalf("GroupIDs = %v, %v; want [10 16777223]", ids, err)
	}
	out := o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock)
	if !strings.Contains(out, "bucket_id:0,actions=output:1") || !strings.Contains(out, "weight:3,actions=set_field:0x9->reg2,resubmit(,10)") {
		t.Fatalf("modified group not as expected:\n%s", out)
	}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpDelete, Group: GroupEntry{ID: 10}}}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if out := o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock); strings.Contains(out, "group_id=10") {
		t.Fatalf("group 10 still present:\n%s", out)
	}
}

// A select group with a selection method goes over OpenFlow 1.5, and OVS
// reports the method and fields.
func TestGroupSelectionMethod(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	g := GroupEntry{ID: 20, Type: GroupSelect, Selection: &Selection{Method: "hash",
		Fields: []HashField{HashIPv4Src, HashIPv4Dst, HashIPProto, HashUDPSrc, HashUDPDst}, Param: 7},
		Buckets: []Bucket{{Actions: []Action{Output{1}}}, {Weight: 2, Actions: []Action{LoadReg{Reg: 6, Value: 9}, Resubmit{42}}}}}
	for _, op := range []GroupOp{GroupOpAdd, GroupOpModify} {
		if err := c.ApplyGroups(ctx, []GroupMod{{Op: op, Group: g}}); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
	}
	out := o.Run("ovs-ofctl", "-O", "OpenFlow15", "dump-groups", sock)
	for _, want := range []string{"selection_method=hash,selection_method_param=7,fields(ip_src,ip_dst,nw_proto,udp_src,udp_dst)",
		"bucket=bucket_id:0,actions=output:1", "bucket=bucket_id:1,weight:2,actions=set_field:0x9->reg6,resubmit(,42)"} {
		if !strings.Contains(out, want) {
			t.Errorf("dump-groups lacks %q:\n%s", want, out)
		}
	}
	// A bad group (unknown method) fails with an error naming it, and the
	// connection keeps working.
	bad := g
	bad.ID, bad.Selection = 21, &Selection{Method: "nonsense"}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: bad}}); err == nil || !strings.Contains(err.Error(), "group_id=21") {
		t.Errorf("unknown method: %v, want an error naming group 21", err)
	}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpDelete, Group: GroupEntry{ID: 20}}}); err != nil {
		t.Fatal(err)
	}
	g.ID = 22
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: g}}); err != nil {
		t.Fatalf("after an error: %v", err)
	}
}

func TestDialErrors(t *testing.T) {
	if _, err := Dial(context.Background(), "ssl:1.2.3.4:6653", nil); err == nil {
		t.Error("Dial accepted an unsupported target")
	}
	ctx := testCtx(t)
	_, err := Dial(ctx, "unix:/nonexistent/br.mgmt", nil, WithConnectTimeout(300*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/br.mgmt") {
		t.Errorf("Dial(missing socket) = %v, want an error naming the socket", err)
	}
}

func TestReconnectReplaysAfterRestart(t *testing.T) {
	o, sock := startBridge(t)
	flows := []Flow{
		{Table: 0, Priority: 10, Cookie: 0xb1, Match: Match{InPort: 1}, Actions: []Action{GotoTable{1}}},
		{Table: 1, Priority: 10, Cookie: 0xb2, Match: Match{}, Actions: []Action{Output{2}}},
	}
	var client atomic.Pointer[Client]
	replays := make(chan error, 10)
	c := dial(t, sock,
		WithBackoff(50*time.Millisecond, 500*time.Millisecond),
		WithEchoInterval(time.Second),
		WithOnReconnect(func(ctx context.Context) error {
			// The restarted switch has empty tables; the replay refills them.
			before, err := client.Load().DumpFlows(ctx, nil, 0, 0)
			if err == nil && len(before) != 0 {
				err = fmt.Errorf("%d flows survived the restart", len(before))
			}
			if err == nil {
				err = client.Load().Apply(ctx, adds(flows))
			}
			replays <- err
			return err
		}))
	client.Store(c)
	ctx := testCtx(t)
	if err := c.Apply(ctx, adds(flows)); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	o.Restart()
	select {
	case err := <-replays:
		if err != nil {
			t.Fatalf("replay after restart failed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("OnReconnect did not run after ovs-vswitchd restart")
	}
	if got := cookies(t, c); !equal(got, []uint64{0xb1, 0xb2}) {
		t.Fatalf("after replay cookies = %#x, want [0xb1 0xb2]", got)
	}
	if err := c.Apply(ctx, []FlowMod{{Op: OpAdd, Flow: Flow{Table: 1, Priority: 20, Cookie: 0xb3, Match: Match{InPort: 3}, Actions: []Action{Output{4}}}}}); err != nil {
		t.Fatalf("Apply after reconnect: %v", err)
	}
	if lines := ofctlFlows(t, o, sock); len(lines) != 3 {
		t.Fatalf("want 3 flows after reconnect, got:\n%s", strings.Join(lines, "\n"))
	}
}

func TestCloseStopsClient(t *testing.T) {
	_, sock := startBridge(t)
	c := dial(t, sock)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Apply(testCtx(t), adds([]Flow{{Match: Match{InPort: 1}}})); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close = %v, want ErrClosed", err)
	}
}

func BenchmarkApply1000Flows(b *testing.B) {
	_, sock := startBridge(b)
	c := dial(b, sock)
	ctx := context.Background()
	mods := make([]FlowMod, 1000)
	for i := range mods {
		mods[i] = FlowMod{Op: OpAdd, Flow: Flow{Table: 10, Priority: 100, Cookie: 0xbe00,
			Match:   Match{EthType: 0x0800, IPDst: &net.IPNet{IP: net.IPv4(10, 1, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}},
			Actions: []Action{LoadReg{Reg: 1, Value: uint32(i)}, CT{Zone: 1, Table: ptr(uint8(20))}}}}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Apply(ctx, mods); err != nil {
			b.Fatalf("Apply: %v", err)
		}
	}
	b.StopTimer()
	fs, err := c.DumpFlows(ctx, ptr(uint8(10)), 0, 0)
	if err != nil || len(fs) != 1000 {
		b.Fatalf("DumpFlows = %d flows, %v; want 1000", len(fs), err)
	}
}

// A dump larger than one 64 KiB reply arrives in several multipart parts.
func TestDumpFlowsMultipart(t *testing.T) {
	_, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	const n = 1500
	mods := make([]FlowMod, n)
	for i := range mods {
		mods[i] = FlowMod{Op: OpAdd, Flow: Flow{Table: uint8(i % 3), Priority: uint16(i), Cookie: 0x7000 + uint64(i),
			Match:   Match{EthType: 0x0800, IPSrc: &net.IPNet{IP: net.IPv4(10, 2, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}},
			Actions: []Action{Output{1}}}}
	}
	if err := c.Apply(ctx, mods); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	fs, err := c.DumpFlows(ctx, nil, 0, 0)
	if err != nil {
		t.Fatalf("DumpFlows: %v", err)
	}
	if len(fs) != n {
		t.Fatalf("DumpFlows returned %d flows, want %d", len(fs), n)
	}
	for _, f := range fs {
		i := int(f.Cookie - 0x7000)
		if i < 0 || i >= n || f.Priority != uint16(i) || f.Table != uint8(i%3) || !f.Match.IPSrc.IP.Equal(net.IPv4(10, 2, byte(i>>8), byte(i))) {
			t.Fatalf("flow %s does not match what was applied", f.Flow)
		}
	}
	if err := c.DeleteMatching(ctx, 0, 0); err != nil {
		t.Fatalf("DeleteMatching(all): %v", err)
	}
	if got := cookies(t, c); len(got) != 0 {
		t.Fatalf("%d flows left after deleting all", len(got))
	}
}

// TestMeters adds a meter, a flow through it, changes the meter's rate in
// place (the flow must stay: a delete and add would take it along) and
// deletes it, on the userspace datapath.
func TestMeters(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	ctx := testCtx(t)
	f, err := c.MeterFeatures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Usable(65279) {
		t.Fatalf("netdev bridge meter features %+v: want kbps drop bands with bursts up to id 65279", f)
	}
	m := MeterEntry{ID: 7, RateKbps: 20000, BurstKbits: 4000}
	if err := c.EnsureMeter(ctx, m); err != nil {
		t.Fatal(err)
	}
	flow := Flow{Table: 0, Priority: 100, Cookie: 0x70, Match: Match{InPort: 3}, Actions: []Action{Meter{7}, LoadReg{Reg: 0, Value: 1}, GotoTable{10}}}
	if err := c.Apply(ctx, adds([]Flow{flow})); err != nil {
		t.Fatal(err)
	}
	meters := func() string {
		return o.Run("ovs-ofctl", "-O", "OpenFlow13", "dump-meters", sock)
	}
	if out := meters(); !strings.Contains(out, "meter=7 kbps burst stats bands=\ntype=drop rate=20000 burst_size=4000") {
		t.Fatalf("meter 7 not as added:\n%s", out)
	}
	if l := ofctlFlows(t, o, sock); len(l) != 1 || !strings.Contains(l[0], "actions=meter:7,load:0x1->NXM_NX_REG0[],goto_table:10") &&
		!strings.Contains(l[0], "actions=meter:7,set_field:0x1->reg0,goto_table:10") {
		t.Fatalf("flows: %q", l)
	}
	// A meter of 1 kbps with a 1-kbit bucket drops a 100-byte frame (800
	// bits) sent twice in a row: the second finds the bucket empty.
	tiny := MeterEntry{ID: 8, RateKbps: 1, BurstKbits: 1}
	if err := c.EnsureMeter(ctx, tiny); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, adds([]Flow{{Table: 0, Priority: 100, Match: Match{InPort: 4}, Actions: []Action{Meter{8}}}})); err != nil {
		t.Fatal(err)
	}
	frame := "0a00000000020a000000000108004500005600000000401100000a0000010a000002" + strings.Repeat("00", 66)
	for range 2 {
		o.Run("ovs-ofctl", "-O", "OpenFlow13", "packet-out", sock, "in_port=4 packet="+frame+" actions=table")
	}
	st, err := c.MeterStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(st, func(a, b MeterStats) int { return int(a.ID) - int(b.ID) })
	if len(st) != 2 || st[0].ID != 7 || st[0].Flows != 1 || st[0].Packets != 0 ||
		st[1].ID != 8 || st[1].Flows != 1 || st[1].Packets != 2 || st[1].Bytes != 200 || st[1].DroppedPackets != 1 || st[1].DroppedBytes != 100 {
		t.Fatalf("meter stats %+v; want meter 7 with one flow and no packets, meter 8 with 2 packets of 100 bytes in and 1 dropped", st)
	}
	if err := c.DeleteMeter(ctx, 8); err != nil {
		t.Fatal(err)
	}

	m.RateKbps, m.BurstKbits = 50000, 8000
	if err := c.EnsureMeter(ctx, m); err != nil {
		t.Fatalf("ensure again (modify): %v", err)
	}
	if out := meters(); !strings.Contains(out, "rate=50000 burst_size=8000") {
		t.Fatalf("meter 7 not modified:\n%s", out)
	}
	if l := ofctlFlows(t, o, sock); len(l) != 1 {
		t.Fatalf("modifying the meter took its flow along: %q", l)
	}

	// Bad input is refused before it reaches the switch, or by the switch
	// with a named error.
	if err := c.Apply(ctx, adds([]Flow{{Table: 0, Priority: 90, Actions: []Action{LoadReg{Reg: 0, Value: 1}, Meter{7}}}})); err == nil || !strings.Contains(err.Error(), "meter must be the first action") {
		t.Errorf("meter after another action: %v", err)
	}
	if err := c.Apply(ctx, adds([]Flow{{Table: 0, Priority: 90, Actions: []Action{Meter{8}, Output{1}}}})); err == nil {
		t.Error("a flow through a meter that does not exist was accepted")
	}
	if err := c.EnsureMeter(ctx, MeterEntry{ID: 9}); err == nil || !strings.Contains(err.Error(), "must both be positive") {
		t.Errorf("meter without a rate: %v", err)
	}
	if err := c.ApplyGroups(ctx, []GroupMod{{Op: GroupOpAdd, Group: GroupEntry{ID: 1, Type: GroupAll,
		Buckets: []Bucket{{Actions: []Action{Meter{7}}}}}}}); err == nil {
		t.Error("a meter in a group bucket was accepted")
	}

	if err := c.DeleteMeter(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if out := meters(); strings.Contains(out, "meter=7") {
		t.Fatalf("meter 7 still there:\n%s", out)
	}
	if l := ofctlFlows(t, o, sock); len(l) != 0 {
		t.Fatalf("the meter's flow outlived it: %q", l)
	}
	if err := c.DeleteMeter(ctx, 7); err != nil {
		t.Errorf("deleting a meter that is gone: %v", err)
	}
}

package openflow

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A packet-out runs through the pipeline with the registers its actions
// loaded; a flow sends it to the controller, and the packet-in carries the
// table, cookie, registers and tunnel key it had there.
func TestPacketOutAndPacketIn(t *testing.T) {
	o, sock := startBridge(t)
	o.Run("ovs-vsctl", "add-port", "br-int", "p1", "--", "set", "interface", "p1", "type=internal", "ofport_request=5")
	c := dial(t, sock)
	got := make(chan PacketIn, 4)
	cancel := c.SubscribePacketIns(func(pi PacketIn) {
		select {
		case got <- pi:
		default:
		}
	})
	defer cancel()
	flows := []FlowMod{
		{Op: OpAdd, Flow: Flow{Table: 0, Priority: 10, Match: Match{EthType: 0x0800}, Actions: []Action{GotoTable{Table: 3}}}},
		{Op: OpAdd, Flow: Flow{Table: 3, Priority: 20, Cookie: 0xabc, Match: Match{EthType: 0x0800,
			Regs: []RegMatch{{Reg: 3, Value: 1 << 16, Mask: 1 << 16}}},
			Actions: []Action{
				SetTunID{ID: 0x800000},
				MoveRange{Src: FieldReg(3), Dst: FieldTunID, NBits: 16},
				Output{Port: PortController},
			}}},
	}
	if err := c.Apply(testCtx(t), flows); err != nil {
		t.Fatal(err)
	}
	dump := strings.Join(ofctlFlows(t, o, sock), "\n")
	if !strings.Contains(dump, "move:NXM_NX_REG3[0..15]->NXM_NX_TUN_ID[0..15]") || !strings.Contains(dump, "set_field:0x800000->tun_id") {
		t.Fatalf("flows not encoded as expected:\n%s", dump)
	}
	// An IPv4 frame (the payload does not matter for this pipeline).
	pkt := append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0,
		0x45, 0, 0, 20, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2}, make([]byte, 26)...)
	err := c.PacketOut(testCtx(t), 5, []Action{
		LoadReg{Reg: 3, Ofs: 16, NBits: 1, Value: 1},
		LoadReg{Reg: 3, Ofs: 0, NBits: 16, Value: 0x1234},
		Resubmit{Table: 0},
	}, pkt)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case pi := <-got:
		if pi.Table != 3 || pi.Cookie != 0xabc || pi.Metadata.InPort != 5 {
			t.Errorf("packet-in from table %d cookie %#x in_port %d, want 3, 0xabc, 5", pi.Table, pi.Cookie, pi.Metadata.InPort)
		}
		var reg3 uint32
		for _, r := range pi.Metadata.Regs {
			if r.Reg == 3 {
				reg3 = r.Value
			}
		}
		if reg3 != 0x11234 {
			t.Errorf("reg3 = %#x, want 0x11234 (metadata %s)", reg3, pi.Metadata)
		}
		if pi.Metadata.TunID == nil || pi.Metadata.TunID.Value != 0x801234 {
			t.Errorf("tun_id = %v, want 0x801234 (metadata %s)", pi.Metadata.TunID, pi.Metadata)
		}
		if !bytes.Equal(pi.Data, pkt) {
			t.Errorf("packet-in data differs from the packet sent:\n got %x\nwant %x", pi.Data, pkt)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no packet-in within 5s")
	}
	if !c.Connected() {
		t.Error("Connected() = false on a live connection")
	}
}

func TestFormatActions(t *testing.T) {
	names := func(t uint8) string { return map[uint8]string{70: "L3Forwarding", 31: "ConntrackState"}[t] }
	tbl := uint8(31)
	got := FormatActions([]Action{
		LoadReg{Reg: 0, Ofs: 0, NBits: 4, Value: 3},
		CT{Zone: 65520, Table: &tbl, NAT: &CTNAT{}},
		MoveRange{Src: FieldReg(3), Dst: FieldTunID, NBits: 16},
		Output{Port: PortController},
		GotoTable{Table: 70},
	}, names)
	want := "load:0x3->reg0[0..3],ct(zone=65520,table=ConntrackState,nat),move:reg3[0..15]->tun_id[0..15],output:CONTROLLER,goto_table:L3Forwarding"
	if got != want {
		t.Errorf("FormatActions:\n got %s\nwant %s", got, want)
	}
	if FormatActions(nil, nil) != "drop" {
		t.Error("an empty action list should read drop")
	}
}

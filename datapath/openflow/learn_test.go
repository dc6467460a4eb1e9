package openflow

import (
	"strings"
	"testing"
)

// A learn action is accepted by OVS and reads back, as ovs-ofctl prints
// it, with every spec in place.
func TestLearnAction(t *testing.T) {
	o, sock := startBridge(t)
	c := dial(t, sock)
	learn := Learn{Table: 41, Priority: 190, HardTimeout: 30, Cookie: 0x5000000000,
		Specs: []LearnSpec{
			{Kind: LearnMatchValue, Dst: LearnEthType, Value: 0x800},
			{Kind: LearnMatchValue, Dst: LearnIPProto, Value: 6},
			{Kind: LearnMatchField, Dst: LearnIPSrc},
			{Kind: LearnMatchField, Dst: LearnIPDst},
			{Kind: LearnMatchField, Dst: LearnTCPDst},
			{Kind: LearnLoadField, Src: LearnReg(3), Dst: LearnReg(3)},
			{Kind: LearnLoadValue, Dst: LearnReg(0), DstOfs: 17, NBits: 1, Value: 1},
		}}
	f := Flow{Table: 42, Priority: 100, Match: Match{EthType: 0x0800, IPProto: 6},
		Actions: []Action{learn, Resubmit{Table: 50}}}
	if err := c.Apply(testCtx(t), []FlowMod{{Op: OpAdd, Flow: f}}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got := strings.Join(ofctlFlows(t, o, sock), "\n")
	for _, want := range []string{
		"learn(table=41,hard_timeout=30,priority=190,cookie=0x5000000000,eth_type=0x800,nw_proto=6,NXM_OF_IP_SRC[],NXM_OF_IP_DST[],NXM_OF_TCP_DST[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:0x1->NXM_NX_REG0[17])",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("flows:\n%s\nwant %s", got, want)
		}
	}
	// Malformed specs are refused before reaching the switch.
	for _, bad := range []Learn{
		{Table: 1},
		{Table: 1, Specs: []LearnSpec{{Kind: LearnLoadValue, Dst: LearnReg(0), NBits: 1, Value: 2}}},
		{Table: 1, Specs: []LearnSpec{{Kind: LearnMatchField, Dst: "nonsense"}}},
		{Table: 1, Specs: []LearnSpec{{Kind: LearnLoadField, Src: LearnReg(1), Dst: LearnReg(2), DstOfs: 30, NBits: 4}}},
	} {
		if _, err := encodeLearn(bad); err == nil {
			t.Errorf("encodeLearn(%+v) succeeded, want an error", bad)
		}
	}
}

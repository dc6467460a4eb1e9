package pipeline_test

import (
	"net"
	"testing"

	of "github.com/seine-net/seine/datapath/openflow"
	"github.com/seine-net/seine/datapath/pipeline"
)

func TestPolicyBaseFlows(t *testing.T) {
	br := pipeline.Bridge{Round: 3, GatewayPort: 2, GatewayIP: net.ParseIP("10.244.1.1"), NodeIP: net.ParseIP("198.18.0.11")}
	fs := pipeline.PolicyBaseFlows(br)
	if len(fs) != 4 {
		t.Fatalf("%d flows, want 4 (two -new bypasses, two host sources)", len(fs))
	}
	for _, f := range fs {
		if f.Cookie != pipeline.Cookie(3, pipeline.CategoryPolicy, 0) || f.Priority <= pipeline.PrioPolicyAllow {
			t.Errorf("flow %v: cookie %#x priority %d", f.Match, f.Cookie, f.Priority)
		}
		g := f.Actions[len(f.Actions)-1].(of.GotoTable)
		want := pipeline.IngressDefault.Next()
		if f.Table == uint8(pipeline.EgressRule) {
			want = pipeline.EgressDefault.Next()
		}
		if g.Table != uint8(want) {
			t.Errorf("flow in table %d goes to %d, want %d", f.Table, g.Table, want)
		}
	}
	if pipeline.EgressDefault.Next() != pipeline.L3Forwarding || pipeline.IngressDefault.Next() != pipeline.ConntrackCommit {
		t.Error("policy allows do not continue where the pipeline expects")
	}
}

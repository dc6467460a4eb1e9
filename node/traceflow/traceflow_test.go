package traceflow

import (
	"testing"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
)

func hop(node, action, next string) opsv1alpha1.TraceflowNode {
	return opsv1alpha1.TraceflowNode{Node: node, Action: action, NextNode: next}
}

// The reports are ordered along the path, and the trace is done only when
// the path from the source ends in a Node that did not forward.
func TestChainAndOutcome(t *testing.T) {
	fwd, del, drop := opsv1alpha1.TraceForwarded, opsv1alpha1.TraceDelivered, opsv1alpha1.TraceDropped
	cases := []struct {
		name     string
		nodes    []opsv1alpha1.TraceflowNode
		order    []string
		result   string
		finished bool
	}{
		{"one Node", []opsv1alpha1.TraceflowNode{hop("a", del, "")}, []string{"a"}, del, true},
		{"remote reported first", []opsv1alpha1.TraceflowNode{hop("b", drop, ""), hop("a", fwd, "b")}, []string{"a", "b"}, drop, true},
		{"waiting for the next Node", []opsv1alpha1.TraceflowNode{hop("a", fwd, "b")}, []string{"a"}, "", false},
		{"source not reported yet", []opsv1alpha1.TraceflowNode{hop("b", del, "")}, []string{"b"}, "", false},
		{"off-path report last", []opsv1alpha1.TraceflowNode{hop("c", del, ""), hop("a", fwd, "b"), hop("b", del, "")}, []string{"a", "b", "c"}, del, true},
	}
	for _, tc := range cases {
		got := chain("a", tc.nodes)
		var order []string
		for _, n := range got {
			order = append(order, n.Node)
		}
		if len(order) != len(tc.order) {
			t.Errorf("%s: order %v, want %v", tc.name, order, tc.order)
			continue
		}
		for i := range order {
			if order[i] != tc.order[i] {
				t.Errorf("%s: order %v, want %v", tc.name, order, tc.order)
				break
			}
		}
		res, done := outcome("a", got)
		if res != tc.result || done != tc.finished {
			t.Errorf("%s: outcome %q %v, want %q %v", tc.name, res, done, tc.result, tc.finished)
		}
	}
}

package agent

import (
	"strings"
	"testing"
)

func TestIdentityProblem(t *testing.T) {
	const sa = "system:serviceaccount:seine-system:seine"
	for _, tc := range []struct {
		name, user string
		extra      map[string][]string
		want       string // a part of the problem; "" for none
	}{
		{"a seine Pod's token", sa, map[string][]string{nodeNameExtra: {"node-1"}}, ""},
		{"bound to no Node", sa, nil, "bound to no Node"},
		{"bound to another Node", sa, map[string][]string{nodeNameExtra: {"node-2"}}, "bound to Node node-2, not to this Node node-1"},
		{"not a ServiceAccount", "kubernetes-admin", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := identityProblem(tc.user, tc.extra, "node-1")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("identityProblem = %q, want %q", got, tc.want)
			}
		})
	}
}

package ctl

import (
	"strings"
	"testing"

	kubefake "k8s.io/client-go/kubernetes/fake"

	opsfake "github.com/seine-net/seine/node/client/clientset/versioned/fake"
	cpfake "github.com/seine-net/seine/policy/client/clientset/versioned/fake"
)

// Every command refuses an -o it does not know, naming the formats it
// does, before it does anything.
func TestUnknownOutputFormatIsRefused(t *testing.T) {
	text, table := "want json or yaml", "want wide, json or yaml"
	for _, tc := range []struct{ args, want string }{
		{"version -o text", text},
		{"version -o wide", text},
		{"trace-packet -S a -D b -o jsn", text},
		{"traceflow -S a -D b -o table", text},
		{"query endpoint -p a -o xml", text},
		{"log-level -o wide", text},
		{"get agentinfo -o jsonpath", table},
		{"get networkpolicy -o name", table},
		{"get addressgroup -o Json", table},
		{"get podinterface -o x", table},
		{"get ovsflows -o x", table},
	} {
		ops := opsfake.NewSimpleClientset()
		app, out, _ := testApp(&clients{kube: kubefake.NewSimpleClientset(), cp: cpfake.NewSimpleClientset(), ops: ops})
		args := append([]string{"seinectl", "--socket", t.TempDir() + "/none.sock"}, strings.Fields(tc.args)...)
		err := app.Run(interspersed(app, args))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "output format") {
			t.Errorf("%s: error %v, want one naming the formats (%s)", tc.args, err, tc.want)
		}
		if out.Len() > 0 || len(ops.Actions()) > 0 {
			t.Errorf("%s: ran anyway: printed %q, actions %v", tc.args, out.String(), ops.Actions())
		}
	}
}

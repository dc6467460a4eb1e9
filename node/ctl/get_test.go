package ctl

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	opsfake "github.com/seine-net/seine/node/client/clientset/versioned/fake"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpfake "github.com/seine-net/seine/policy/client/clientset/versioned/fake"
)

// policyState is a cluster with one computed policy, default/web, and its
// groups.
func policyState() *clients {
	group := func(key string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: key + "-n1", Labels: map[string]string{cpv1alpha1.GroupLabel: key}}
	}
	return &clients{kube: kubefake.NewSimpleClientset(), cp: cpfake.NewSimpleClientset(
		&cpv1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np-u1"},
			Spec: cpv1alpha1.NetworkPolicySpec{Source: cpv1alpha1.PolicyReference{Namespace: "default", Name: "web", UID: "u1"}, AppliedToGroup: "atg1"}},
		&cpv1alpha1.AppliedToGroup{ObjectMeta: group("atg1")},
		&cpv1alpha1.AddressGroup{ObjectMeta: group("ag1")},
	)}
}

// A name that matches nothing is an error naming the kind and the name, as
// with kubectl; a name that matches is printed.
func TestGetByNameNotFound(t *testing.T) {
	for _, tc := range []struct {
		args    string
		shows   string // the output holds it
		missing string // the error names it; "" when found
	}{
		{"get networkpolicy default/web", "np-u1", ""},
		{"get networkpolicy np-u1", "np-u1", ""},
		{"get networkpolicy web", "np-u1", ""},
		{"get networkpolicy -n default web", "np-u1", ""},
		{"get networkpolicy web -n default", "np-u1", ""},
		{"get networkpolicy", "np-u1", ""},
		{"get networkpolicy -n other", "", ""}, // a filter without a name: an empty list
		{"get networkpolicy default/nope", "", `networkpolicy "default/nope" not found`},
		{"get networkpolicy -n other web", "", `networkpolicy "web" not found in namespace "other"`},
		{"get appliedtogroup atg1", "atg1-n1", ""},
		{"get appliedtogroup atg1-n1", "atg1-n1", ""},
		{"get appliedtogroup nope", "", `appliedtogroup "nope" not found`},
		{"get addressgroup ag1", "ag1-n1", ""},
		{"get addressgroup nope", "", `addressgroup "nope" not found`},
	} {
		app, out, _ := testApp(policyState())
		err := app.Run(interspersed(app, append([]string{"seinectl"}, strings.Fields(tc.args)...)))
		switch {
		case tc.missing == "" && err != nil:
			t.Errorf("%s: %v", tc.args, err)
		case tc.missing != "" && (err == nil || !strings.Contains(err.Error(), tc.missing)):
			t.Errorf("%s: error %v, want %q", tc.args, err, tc.missing)
		case tc.missing != "" && out.Len() > 0:
			t.Errorf("%s: printed %q", tc.args, out.String())
		case !strings.Contains(out.String(), tc.shows):
			t.Errorf("%s: printed %q, want %s", tc.args, out.String(), tc.shows)
		}
	}
}

// An empty list is [] in JSON and YAML, not null.
func TestEmptyListPrintsEmpty(t *testing.T) {
	for _, o := range []string{"json", "yaml"} {
		for _, args := range []string{"get networkpolicy", "get appliedtogroup", "get controllerinfo"} {
			cl := &clients{kube: kubefake.NewSimpleClientset(), cp: cpfake.NewSimpleClientset(), ops: opsfake.NewSimpleClientset()}
			app, out, _ := testApp(cl)
			if err := app.Run(append(append([]string{"seinectl"}, strings.Fields(args)...), "-o", o)); err != nil {
				t.Fatalf("%s -o %s: %v", args, o, err)
			}
			if got := strings.TrimSpace(out.String()); got != "[]" {
				t.Errorf("%s -o %s printed %q, want []", args, o, got)
			}
		}
	}
}

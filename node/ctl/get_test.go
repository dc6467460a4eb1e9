package ctl

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsfake "github.com/seine-net/seine/node/client/clientset/versioned/fake"
	"github.com/seine-net/seine/node/info"
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

func agentInfo(name string, heartbeat time.Time) *opsv1alpha1.AgentInfo {
	conds := []metav1.Condition{}
	for _, typ := range []string{opsv1alpha1.AgentReady, opsv1alpha1.AgentOVSConnected, opsv1alpha1.AgentAPIConnected, opsv1alpha1.AgentPoliciesRealized} {
		conds = append(conds, metav1.Condition{Type: typ, Status: metav1.ConditionTrue})
	}
	return &opsv1alpha1.AgentInfo{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: opsv1alpha1.AgentInfoStatus{Conditions: conds, LastHeartbeatTime: metav1.NewTime(heartbeat)}}
}

// The conditions of an AgentInfo whose daemon stopped writing it (three
// heartbeats missed) are Unknown, not the last ones it wrote.
func TestAgentInfoRowStaleHeartbeat(t *testing.T) {
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ago  time.Duration // since the last heartbeat; <0: never
		want string
		age  string
	}{
		{"fresh", 30 * time.Second, "True", "30s"},
		{"two heartbeats late", 2 * info.DefaultHeartbeat, "True", "2m"},
		{"three heartbeats late", 3*info.DefaultHeartbeat + time.Second, "Unknown", "3m1s"},
		{"dead for an hour", time.Hour, "Unknown", "60m"},
		{"never written", -1, "Unknown", "<unknown>"},
	} {
		hb := now.Add(-tc.ago)
		if tc.ago < 0 {
			hb = time.Time{}
		}
		row := agentInfoRow(agentInfo("n1", hb), now)
		if got := row[1]; got != tc.want {
			t.Errorf("%s: READY %v, want %s", tc.name, got, tc.want)
		}
		for _, i := range []int{14, 15, 16} { // OVS-CONNECTED, API-CONNECTED, POLICIES-REALIZED
			if row[i] != tc.want {
				t.Errorf("%s: condition column %d is %v, want %s", tc.name, i, row[i], tc.want)
			}
		}
		if got := row[9]; got != tc.age {
			t.Errorf("%s: HEARTBEAT %v, want %s", tc.name, got, tc.age)
		}
	}
}

// get agentinfo shows a silent daemon's Node as READY Unknown.
func TestGetAgentInfoStale(t *testing.T) {
	ops := opsfake.NewSimpleClientset(agentInfo("live", time.Now()), agentInfo("dead", time.Now().Add(-time.Hour)))
	app, out, _ := testApp(&clients{ops: ops})
	if err := app.Run([]string{"seinectl", "get", "agentinfo"}); err != nil {
		t.Fatal(err)
	}
	ready := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
		f := strings.Fields(l)
		ready[f[0]] = f[1]
	}
	if ready["live"] != "True" || ready["dead"] != "Unknown" {
		t.Fatalf("READY %v, want live True and dead Unknown:\n%s", ready, out.String())
	}
}

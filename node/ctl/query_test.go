package ctl

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"

	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	cpfake "github.com/seine-net/seine/policy/client/clientset/versioned/fake"
)

// endpointState is Pod default/client (10.244.1.5) among computed
// policies whose rules admit it, as the datapath would, in every way a
// rule can, and some that do not.
func endpointState() (*corev1.Pod, []cpv1alpha1.NetworkPolicy, []cpv1alpha1.AppliedToGroup, []cpv1alpha1.AddressGroup) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "client"},
		Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}}}}
	client := cpv1alpha1.GroupMember{Namespace: "default", Name: "client", IPs: []string{"10.244.1.5"}}
	server := cpv1alpha1.GroupMember{Namespace: "default", Name: "server", IPs: []string{"10.244.2.7"}}
	group := func(key string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: key + "-0", Labels: map[string]string{cpv1alpha1.GroupLabel: key}}
	}
	ags := []cpv1alpha1.AddressGroup{
		{ObjectMeta: group("all"), Spec: cpv1alpha1.AddressGroupSpec{Members: []cpv1alpha1.GroupMember{client, server}}},
		{ObjectMeta: group("web"), Spec: cpv1alpha1.AddressGroupSpec{Members: []cpv1alpha1.GroupMember{server}}},
	}
	atgs := []cpv1alpha1.AppliedToGroup{{ObjectMeta: group("clients"), Spec: cpv1alpha1.AppliedToGroupSpec{NodeName: "n1", Members: []cpv1alpha1.GroupMember{client}}}}
	np := func(name, atg string, rules ...cpv1alpha1.Rule) cpv1alpha1.NetworkPolicy {
		return cpv1alpha1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np-" + name},
			Spec: cpv1alpha1.NetworkPolicySpec{Source: cpv1alpha1.PolicyReference{Namespace: "default", Name: name},
				AppliedToGroup: atg, PolicyTypes: []string{"Egress"}, Rules: rules}}
	}
	in, out := cpv1alpha1.DirectionIn, cpv1alpha1.DirectionOut
	nps := []cpv1alpha1.NetworkPolicy{
		np("a-any", "others", cpv1alpha1.Rule{Direction: in, AllPeers: true}),
		np("b-cidr", "others",
			cpv1alpha1.Rule{Direction: in, IPBlocks: []cpv1alpha1.IPBlock{{CIDR: "10.244.0.0/16", Except: []string{"10.244.2.0/24"}}}},
			cpv1alpha1.Rule{Direction: in, IPBlocks: []cpv1alpha1.IPBlock{{CIDR: "10.244.0.0/16", Except: []string{"10.244.1.0/24"}}}}),
		np("c-within-other", "clients",
			cpv1alpha1.Rule{Direction: out, AddressGroups: []string{"all"}, WithinIPBlocks: []cpv1alpha1.IPBlock{{CIDR: "10.244.2.0/24"}}}),
		np("d-within", "others",
			cpv1alpha1.Rule{Direction: out, AddressGroups: []string{"web"}},
			cpv1alpha1.Rule{Direction: out, AddressGroups: []string{"all"}, WithinIPBlocks: []cpv1alpha1.IPBlock{{CIDR: "10.244.1.0/24"}}}),
		np("e-group", "others", cpv1alpha1.Rule{Direction: in, AddressGroups: []string{"all"}}),
	}
	return pod, nps, atgs, ags
}

func peerOfKeys(ps []peerRule) []string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s#%d", p.Policy, p.Rule))
	}
	return out
}

// query endpoint lists every rule the datapath would admit the Pod by: any
// peer, an ipBlock holding its IP (less the excepts), a group it is in
// (inside withinIPBlocks when set); and a rule's peers are what it admits.
func TestEndpointReport(t *testing.T) {
	rep := endpoint(endpointState())
	want := []string{"default/a-any#1", "default/b-cidr#1", "default/d-within#2", "default/e-group#1"}
	if got := peerOfKeys(rep.PeerOf); !slices.Equal(got, want) {
		t.Errorf("peerOf %v, want %v", got, want)
	}
	via := map[string]string{}
	for _, p := range rep.PeerOf {
		via[fmt.Sprintf("%s#%d", p.Policy, p.Rule)] = p.Via
	}
	for k, v := range map[string]string{"default/a-any#1": "any peer", "default/b-cidr#1": "ipBlock 10.244.0.0/16",
		"default/d-within#2": "group all", "default/e-group#1": "group all"} {
		if via[k] != v {
			t.Errorf("%s admits it via %q, want %q", k, via[k], v)
		}
	}
	if len(rep.Applied) != 1 || len(rep.Applied[0].Rules) != 1 {
		t.Fatalf("applied %+v", rep.Applied)
	}
	if got, want := rep.Applied[0].Rules[0].Peers, []string{"Pods of group all inside ipBlock 10.244.2.0/24 (1: default/server)"}; !slices.Equal(got, want) {
		t.Errorf("peers of a rule with withinIPBlocks: %q, want %q", got, want)
	}
}

// The same through the command, -o json.
func TestQueryEndpointCommand(t *testing.T) {
	pod, nps, atgs, ags := endpointState()
	var objs []runtime.Object
	for i := range nps {
		objs = append(objs, &nps[i])
	}
	for i := range atgs {
		objs = append(objs, &atgs[i])
	}
	for i := range ags {
		objs = append(objs, &ags[i])
	}
	app, out, _ := testApp(&clients{kube: kubefake.NewSimpleClientset(pod), cp: cpfake.NewSimpleClientset(objs...)})
	if err := app.Run([]string{"seinectl", "query", "endpoint", "-p", "default/client", "-o", "json"}); err != nil {
		t.Fatal(err)
	}
	var rep endpointReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	want := []string{"default/a-any#1", "default/b-cidr#1", "default/d-within#2", "default/e-group#1"}
	if got := peerOfKeys(rep.PeerOf); !slices.Equal(got, want) {
		t.Errorf("peerOf %v, want %v", got, want)
	}
	if len(rep.Applied) != 1 || len(rep.Applied[0].Rules) != 1 || !strings.Contains(strings.Join(rep.Applied[0].Rules[0].Peers, ";"), "(1: default/server)") {
		t.Errorf("applied %+v", rep.Applied)
	}
}

// Package reference evaluates NetworkPolicies with an implementation
// independent of Seine's own test evaluator: the policy model of
// github.com/mattfenwick/cyclonus (pkg/matcher), so the differential
// suites compare the datapath, and netpol.Evaluate, against a third
// party's reading of the API.
package reference

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/seine-net/seine/tests/netpol"
)

// Evaluator answers connectivity questions for one policy set.
type Evaluator struct {
	policy *matcher.Policy
	s      *netpol.State
}

// New builds the cyclonus model of policies over state s. cyclonus needs
// explicit policyTypes, so policies without them get the API default
// (Ingress, plus Egress when egress rules exist) on a copy. Invalid
// policies (which cyclonus rejects by panicking) are an error.
func New(policies []*networkingv1.NetworkPolicy, s *netpol.State) (ev *Evaluator, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cyclonus rejected the policies: %v", r)
		}
	}()
	cp := make([]*networkingv1.NetworkPolicy, len(policies))
	for i, p := range policies {
		c := p.DeepCopy()
		if len(c.Spec.PolicyTypes) == 0 {
			in, eg := netpol.PolicyTypes(p)
			if in {
				c.Spec.PolicyTypes = append(c.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
			}
			if eg {
				c.Spec.PolicyTypes = append(c.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
			}
		}
		cp[i] = c
	}
	return &Evaluator{policy: matcher.BuildNetworkPolicies(false, cp), s: s}, nil
}

func (e *Evaluator) peer(p *netpol.Pod) *matcher.TrafficPeer {
	return &matcher.TrafficPeer{
		IP: p.IP.String(),
		Internal: &matcher.InternalPeer{
			PodLabels:       p.Labels,
			NamespaceLabels: e.s.NamespaceLabels[p.Namespace],
			Namespace:       p.Namespace,
		},
	}
}

// Allowed reports cyclonus' verdict for src → dst on port/proto; the port
// name is resolved from dst's container ports.
func (e *Evaluator) Allowed(src, dst *netpol.Pod, port int32, proto corev1.Protocol) bool {
	name := ""
	for _, cp := range dst.Ports {
		if cp.Port == port && cp.Protocol == proto {
			name = cp.Name
		}
	}
	return e.policy.IsTrafficAllowed(&matcher.Traffic{
		Source: e.peer(src), Destination: e.peer(dst),
		ResolvedPort: int(port), ResolvedPortName: name, Protocol: proto,
	}).IsAllowed()
}

// Expect is netpol.Expect by cyclonus: the truth table of the state's
// Pods on pp, with self pairs allowed when selfBypass is set.
func (e *Evaluator) Expect(pp netpol.PortProto, selfBypass bool) *netpol.Matrix {
	m := netpol.NewMatrix(e.s.PodIDs(), false)
	for i := range e.s.Pods {
		for j := range e.s.Pods {
			if i == j && selfBypass {
				m.Set(i, j, true)
				continue
			}
			m.Set(i, j, e.Allowed(&e.s.Pods[i], &e.s.Pods[j], pp.Port, pp.Protocol))
		}
	}
	return m
}

// Dump renders policies as YAML-ish JSON for failure reports.
func Dump(policies []*networkingv1.NetworkPolicy) string {
	var b strings.Builder
	for _, p := range policies {
		j, err := json.Marshal(p.Spec)
		if err != nil {
			j = []byte(err.Error())
		}
		fmt.Fprintf(&b, "%s/%s: %s\n", p.Namespace, p.Name, j)
	}
	return b.String()
}

package ctl

import (
	"fmt"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

// endpointReport answers `seinectl query endpoint`.
type endpointReport struct {
	Pod  string `json:"pod"`
	IP   string `json:"ip"`
	Node string `json:"node"`
	// IsolatedFor lists the directions some applied policy isolates it for.
	IsolatedFor []string `json:"isolatedFor"`
	// Applied are the policies that select the Pod.
	Applied []appliedPolicy `json:"applied"`
	// PeerOf are the rules of other policies that admit it as a peer.
	PeerOf []peerRule `json:"peerOf"`
}

type appliedPolicy struct {
	Policy      string       `json:"policy"`
	Name        string       `json:"name"`
	PolicyTypes []string     `json:"policyTypes"`
	Rules       []ruleReport `json:"rules"`
}

type ruleReport struct {
	Rule      int      `json:"rule"`
	Direction string   `json:"direction"`
	Peers     []string `json:"peers"`
	Ports     []string `json:"ports"`
}

type peerRule struct {
	Policy    string   `json:"policy"`
	Rule      int      `json:"rule"`
	Direction string   `json:"direction"`
	Ports     []string `json:"ports"`
}

func queryCommand() *cli.Command {
	return &cli.Command{
		Name:  "query",
		Usage: "ask questions across the computed policy state",
		Subcommands: []*cli.Command{{
			Name:  "endpoint",
			Usage: "which NetworkPolicies select a Pod and what their rules admit; which rules admit it as a peer",
			Flags: []cli.Flag{textOutputFlag(), &cli.StringFlag{Name: "pod", Aliases: []string{"p"}, Required: true, Usage: "namespace/name"}},
			Action: func(c *cli.Context) error {
				ctx, cancel := timeout(c)
				defer cancel()
				ns, name, err := splitRef(c.String("pod"), "default")
				if err != nil {
					return err
				}
				cl, err := cluster(c)
				if err != nil {
					return err
				}
				pod, err := cl.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				nps, err := cl.cp.ControlplaneV1alpha1().NetworkPolicies().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				atgs, err := cl.cp.ControlplaneV1alpha1().AppliedToGroups().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				ags, err := cl.cp.ControlplaneV1alpha1().AddressGroups().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				rep := endpointReport{Pod: ns + "/" + name, IP: pod.Status.PodIP, Node: pod.Spec.NodeName,
					IsolatedFor: []string{}, Applied: []appliedPolicy{}, PeerOf: []peerRule{}}
				isMember := func(ms []cpv1alpha1.GroupMember) bool {
					for _, m := range ms {
						if m.Namespace == ns && m.Name == name {
							return true
						}
					}
					return false
				}
				targetOf, peerOf := map[string]bool{}, map[string]bool{}
				for _, g := range atgs.Items {
					if isMember(g.Spec.Members) {
						targetOf[g.Labels[cpv1alpha1.GroupLabel]] = true
					}
				}
				groupMembers := map[string][]string{}
				for _, g := range ags.Items {
					key := g.Labels[cpv1alpha1.GroupLabel]
					if isMember(g.Spec.Members) {
						peerOf[key] = true
					}
					for _, m := range g.Spec.Members {
						groupMembers[key] = append(groupMembers[key], m.Namespace+"/"+m.Name)
					}
				}
				iso := map[string]bool{}
				sort.Slice(nps.Items, func(i, j int) bool { return policyName(&nps.Items[i]) < policyName(&nps.Items[j]) })
				for i := range nps.Items {
					np := &nps.Items[i]
					if targetOf[np.Spec.AppliedToGroup] {
						ap := appliedPolicy{Policy: policyName(np), Name: np.Name, PolicyTypes: np.Spec.PolicyTypes}
						for _, t := range np.Spec.PolicyTypes {
							iso[strings.ToLower(t)] = true
						}
						for ri, r := range np.Spec.Rules {
							ap.Rules = append(ap.Rules, ruleReport{Rule: ri + 1, Direction: string(r.Direction), Peers: peers(r, groupMembers), Ports: ports(r.Ports)})
						}
						rep.Applied = append(rep.Applied, ap)
					}
					for ri, r := range np.Spec.Rules {
						for _, g := range r.AddressGroups {
							if peerOf[g] {
								rep.PeerOf = append(rep.PeerOf, peerRule{Policy: policyName(np), Rule: ri + 1, Direction: string(r.Direction), Ports: ports(r.Ports)})
								break
							}
						}
					}
				}
				for _, d := range []string{"ingress", "egress"} {
					if iso[d] {
						rep.IsolatedFor = append(rep.IsolatedFor, d)
					}
				}
				if o := c.String("output"); o == "json" || o == "yaml" {
					return print(c, rep, nil)
				}
				writeEndpoint(c, rep)
				return nil
			},
		}},
	}
}

func policyName(np *cpv1alpha1.NetworkPolicy) string {
	return np.Spec.Source.Namespace + "/" + np.Spec.Source.Name
}

func peers(r cpv1alpha1.Rule, groups map[string][]string) []string {
	if r.AllPeers {
		return []string{"any peer"}
	}
	var out []string
	for _, g := range r.AddressGroups {
		ms := groups[g]
		sort.Strings(ms)
		show := ms
		if len(show) > 5 {
			show = append(show[:5:5], fmt.Sprintf("... %d more", len(ms)-5))
		}
		out = append(out, fmt.Sprintf("Pods of group %s (%d: %s)", g, len(ms), strings.Join(show, ", ")))
	}
	for _, b := range r.IPBlocks {
		s := "ipBlock " + b.CIDR
		if len(b.Except) > 0 {
			s += " except " + strings.Join(b.Except, ",")
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return []string{"no peer"}
	}
	return out
}

func ports(ps []cpv1alpha1.PolicyPort) []string {
	if len(ps) == 0 {
		return []string{"all ports"}
	}
	var out []string
	for _, p := range ps {
		switch {
		case p.Port == nil:
			out = append(out, p.Protocol+"/all")
		case p.EndPort != nil:
			out = append(out, fmt.Sprintf("%s/%s-%d", p.Protocol, p.Port.String(), *p.EndPort))
		default:
			out = append(out, p.Protocol+"/"+p.Port.String())
		}
	}
	return out
}

func writeEndpoint(c *cli.Context, r endpointReport) {
	w := c.App.Writer
	fmt.Fprintf(w, "Endpoint %s (%s, Node %s)\n", r.Pod, r.IP, r.Node)
	if len(r.IsolatedFor) == 0 {
		fmt.Fprintln(w, "Isolated for: nothing (no NetworkPolicy selects it: all traffic allowed)")
	} else {
		fmt.Fprintf(w, "Isolated for: %s (only what the rules below allow)\n", strings.Join(r.IsolatedFor, ", "))
	}
	fmt.Fprintln(w, "Policies selecting it:")
	if len(r.Applied) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, p := range r.Applied {
		fmt.Fprintf(w, "  %s (%s), policyTypes %s\n", p.Policy, p.Name, strings.Join(p.PolicyTypes, ","))
		if len(p.Rules) == 0 {
			fmt.Fprintln(w, "    no rules: denies everything of those types")
		}
		for _, rr := range p.Rules {
			dir := "from"
			if rr.Direction == string(cpv1alpha1.DirectionOut) {
				dir = "to"
			}
			fmt.Fprintf(w, "    rule %d (%s) allows %s %s on %s\n", rr.Rule, rr.Direction, dir, strings.Join(rr.Peers, "; "), strings.Join(rr.Ports, ","))
		}
	}
	fmt.Fprintln(w, "Rules admitting it as a peer:")
	if len(r.PeerOf) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, p := range r.PeerOf {
		fmt.Fprintf(w, "  %s rule %d (%s) on %s\n", p.Policy, p.Rule, p.Direction, strings.Join(p.Ports, ","))
	}
}

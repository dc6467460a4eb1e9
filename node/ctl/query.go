package ctl

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
	"github.com/seine-net/seine/policy/flows"
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
	// PeerOf are the rules that admit it as a peer: through an
	// AddressGroup it is a member of (inside the rule's withinIPBlocks, if
	// any), an ipBlock holding its IP, or as any peer.
	PeerOf []peerRule `json:"peerOf"`
}

type appliedPolicy struct {
	Policy      string       `json:"policy"`
	Name        string       `json:"name"`
	PolicyTypes []string     `json:"policyTypes"`
	Rules       []ruleReport `json:"rules"`
}

// ruleReport is one rule of a policy selecting the Pod. Rule is its place
// (from 1) in the computed policy's spec.rules, which need not be the
// source policy's: rules of a direction the policy does not isolate are
// left out, and an egress rule with named ports may become two.
type ruleReport struct {
	Rule      int      `json:"rule"`
	Direction string   `json:"direction"`
	Peers     []string `json:"peers"`
	Ports     []string `json:"ports"`
}

// peerRule is a rule admitting the Pod as a peer; Rule as in ruleReport.
// Via says how: "any peer", "group <key>" or "ipBlock <cidr>".
type peerRule struct {
	Policy    string   `json:"policy"`
	Name      string   `json:"name"`
	Rule      int      `json:"rule"`
	Direction string   `json:"direction"`
	Via       string   `json:"via"`
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
				rep := endpoint(pod, nps.Items, atgs.Items, ags.Items)
				if o := c.String("output"); o == "json" || o == "yaml" {
					return print(c, rep, nil)
				}
				writeEndpoint(c, rep)
				return nil
			},
		}},
	}
}

// endpoint is the report on pod from the computed policy state, judged as
// the datapath judges (policy/flows): a rule admits a peer that is a
// member of one of its AddressGroups with an address inside its
// withinIPBlocks (when set), a peer whose address is inside one of its
// ipBlocks, or any peer (allPeers).
func endpoint(pod *corev1.Pod, nps []cpv1alpha1.NetworkPolicy, atgs []cpv1alpha1.AppliedToGroup, ags []cpv1alpha1.AddressGroup) endpointReport {
	ns, name := pod.Namespace, pod.Name
	rep := endpointReport{Pod: ns + "/" + name, IP: pod.Status.PodIP, Node: pod.Spec.NodeName,
		IsolatedFor: []string{}, Applied: []appliedPolicy{}, PeerOf: []peerRule{}}
	var podIPs []net.IP
	for _, s := range append([]string{pod.Status.PodIP}, podIPStrings(pod)...) {
		if ip := net.ParseIP(s); ip != nil {
			podIPs = append(podIPs, ip)
		}
	}
	isPod := func(m cpv1alpha1.GroupMember) bool { return m.Namespace == ns && m.Name == name }
	targetOf := map[string]bool{}
	for _, g := range atgs {
		if slices.ContainsFunc(g.Spec.Members, isPod) {
			targetOf[g.Labels[cpv1alpha1.GroupLabel]] = true
		}
	}
	groupMembers := map[string][]cpv1alpha1.GroupMember{}
	for _, g := range ags {
		key := g.Labels[cpv1alpha1.GroupLabel]
		groupMembers[key] = append(groupMembers[key], g.Spec.Members...)
	}
	iso := map[string]bool{}
	nps = slices.Clone(nps)
	sort.SliceStable(nps, func(i, j int) bool { return policyName(&nps[i]) < policyName(&nps[j]) })
	for i := range nps {
		np := &nps[i]
		if targetOf[np.Spec.AppliedToGroup] {
			ap := appliedPolicy{Policy: policyName(np), Name: np.Name, PolicyTypes: np.Spec.PolicyTypes, Rules: []ruleReport{}}
			for _, t := range np.Spec.PolicyTypes {
				iso[strings.ToLower(t)] = true
			}
			for ri, r := range np.Spec.Rules {
				ap.Rules = append(ap.Rules, ruleReport{Rule: ri + 1, Direction: string(r.Direction), Peers: peers(r, groupMembers), Ports: ports(r.Ports)})
			}
			rep.Applied = append(rep.Applied, ap)
		}
		for ri, r := range np.Spec.Rules {
			if via := admits(r, groupMembers, isPod, podIPs); via != "" {
				rep.PeerOf = append(rep.PeerOf, peerRule{Policy: policyName(np), Name: np.Name, Rule: ri + 1,
					Direction: string(r.Direction), Via: via, Ports: ports(r.Ports)})
			}
		}
	}
	for _, d := range []string{"ingress", "egress"} {
		if iso[d] {
			rep.IsolatedFor = append(rep.IsolatedFor, d)
		}
	}
	return rep
}

func podIPStrings(pod *corev1.Pod) []string {
	var out []string
	for _, ip := range pod.Status.PodIPs {
		out = append(out, ip.IP)
	}
	return out
}

// admits says how rule r admits the Pod (isPod its group membership, ips
// its addresses) as a peer, or "" when it does not.
func admits(r cpv1alpha1.Rule, groups map[string][]cpv1alpha1.GroupMember, isPod func(cpv1alpha1.GroupMember) bool, ips []net.IP) string {
	if r.AllPeers {
		return "any peer"
	}
	within := blockNets(r.WithinIPBlocks)
	for _, g := range r.AddressGroups {
		for _, m := range groups[g] {
			if isPod(m) && (len(r.WithinIPBlocks) == 0 || inside(memberIPs(m), within)) {
				return "group " + g
			}
		}
	}
	for _, b := range r.IPBlocks {
		if inside(ips, blockNets([]cpv1alpha1.IPBlock{b})) {
			return "ipBlock " + b.CIDR
		}
	}
	return ""
}

// blockNets are the prefixes of blocks less their excepts, as the
// datapath installs them (a block it cannot read is left out there too).
func blockNets(blocks []cpv1alpha1.IPBlock) []*net.IPNet {
	var out []*net.IPNet
	for _, b := range blocks {
		if nets, err := flows.SubtractCIDRs(b.CIDR, b.Except); err == nil {
			out = append(out, nets...)
		}
	}
	return out
}

func memberIPs(m cpv1alpha1.GroupMember) []net.IP {
	var out []net.IP
	for _, s := range m.IPs {
		if ip := net.ParseIP(s); ip != nil {
			out = append(out, ip)
		}
	}
	return out
}

// inside reports whether an IPv4 address of ips is in one of nets.
func inside(ips []net.IP, nets []*net.IPNet) bool {
	for _, ip := range ips {
		if ip4 := ip.To4(); ip4 != nil && slices.ContainsFunc(nets, func(n *net.IPNet) bool { return n.Contains(ip4) }) {
			return true
		}
	}
	return false
}

func policyName(np *cpv1alpha1.NetworkPolicy) string {
	return np.Spec.Source.Namespace + "/" + np.Spec.Source.Name
}

// peers describes the peers rule r admits: its AddressGroups' Pods (only
// those inside its withinIPBlocks, when set), its ipBlocks, or any peer.
func peers(r cpv1alpha1.Rule, groups map[string][]cpv1alpha1.GroupMember) []string {
	if r.AllPeers {
		return []string{"any peer"}
	}
	var out []string
	within := blockNets(r.WithinIPBlocks)
	for _, g := range r.AddressGroups {
		var ms []string
		for _, m := range groups[g] {
			if len(r.WithinIPBlocks) == 0 || inside(memberIPs(m), within) {
				ms = append(ms, m.Namespace+"/"+m.Name)
			}
		}
		sort.Strings(ms)
		ms = slices.Compact(ms)
		show := ms
		if len(show) > 5 {
			show = append(show[:5:5], fmt.Sprintf("... %d more", len(ms)-5))
		}
		what := "Pods of group " + g
		if len(r.WithinIPBlocks) > 0 {
			what += " inside " + strings.Join(blockNames(r.WithinIPBlocks), ", ")
		}
		out = append(out, fmt.Sprintf("%s (%d: %s)", what, len(ms), strings.Join(show, ", ")))
	}
	out = append(out, blockNames(r.IPBlocks)...)
	if len(out) == 0 {
		return []string{"no peer"}
	}
	return out
}

func blockNames(bs []cpv1alpha1.IPBlock) []string {
	var out []string
	for _, b := range bs {
		s := "ipBlock " + b.CIDR
		if len(b.Except) > 0 {
			s += " except " + strings.Join(b.Except, ",")
		}
		out = append(out, s)
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
	fmt.Fprintln(w, "Policies selecting it (rules numbered as in the computed policy's spec.rules):")
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
			fmt.Fprintf(w, "    computed rule %d (%s) allows %s %s on %s\n", rr.Rule, rr.Direction, dir, strings.Join(rr.Peers, "; "), strings.Join(rr.Ports, ","))
		}
	}
	fmt.Fprintln(w, "Rules admitting it as a peer:")
	if len(r.PeerOf) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, p := range r.PeerOf {
		fmt.Fprintf(w, "  %s (%s) computed rule %d (%s), as %s, on %s\n", p.Policy, p.Name, p.Rule, p.Direction, p.Via, strings.Join(p.Ports, ","))
	}
}

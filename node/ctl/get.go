package ctl

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	"github.com/seine-net/seine/node/info"
	"github.com/seine-net/seine/node/localapi"
	cpv1alpha1 "github.com/seine-net/seine/policy/apis/controlplane/v1alpha1"
)

func getCommand() *cli.Command {
	return &cli.Command{
		Name:  "get",
		Usage: "show Seine's objects, from the cluster or from this Node's daemon",
		Subcommands: []*cli.Command{
			getAgentInfo(), getControllerInfo(), getNetworkPolicy(), getAppliedToGroup(), getAddressGroup(),
			getPodInterface(), getService(), getOVSFlows(),
		},
	}
}

func timeout(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, 30*time.Second)
}

func condStatus(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return string(c.Status)
	}
	return "Unknown"
}

func getAgentInfo() *cli.Command {
	return &cli.Command{
		Name: "agentinfo", Aliases: []string{"agentinfos", "sai"}, ArgsUsage: "[node]",
		Usage: "each Node's daemon: versions, datapath, counts, conditions (--local: this Node's figures now)",
		Flags: []cli.Flag{outputFlag(), &cli.BoolFlag{Name: "local", Usage: "ask this Node's daemon instead of the cluster"}},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			var items []opsv1alpha1.AgentInfo
			if c.Bool("local") {
				var st localapi.AgentInfo
				if err := local(c).Get(ctx, "/v1/agentinfo", nil, &st); err != nil {
					return err
				}
				var v localapi.Version
				if err := local(c).Get(ctx, "/v1/version", nil, &v); err != nil {
					return err
				}
				items = []opsv1alpha1.AgentInfo{{ObjectMeta: metav1.ObjectMeta{Name: v.Node}, Status: st}}
			} else {
				cl, err := cluster(c)
				if err != nil {
					return err
				}
				l, err := cl.ops.OpsV1alpha1().AgentInfos().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				items = l.Items
			}
			if name := c.Args().First(); name != "" {
				var keep []opsv1alpha1.AgentInfo
				for _, a := range items {
					if a.Name == name {
						keep = append(keep, a)
					}
				}
				if len(keep) == 0 {
					return fmt.Errorf("agentinfo %q not found", name)
				}
				items = keep
			}
			t := &table{Columns: []string{"NAME", "READY", "VERSION", "OVS", "DATAPATH", "MODE", "PODS", "FLOWS", "POLICIES", "HEARTBEAT"},
				Wide: []string{"TUNNEL", "NODE-IP", "POD-CIDR", "PEERS", "OVS-CONNECTED", "API-CONNECTED", "POLICIES-REALIZED"}}
			now := time.Now()
			for i := range items {
				t.add(agentInfoRow(&items[i], now)...)
			}
			if len(items) == 1 && c.Args().Len() > 0 {
				return print(c, items[0], t)
			}
			return print(c, items, t)
		},
	}
}

// staleHeartbeat is how long an AgentInfo may go unwritten before its
// conditions show Unknown: three heartbeats (a daemon writes it at least
// every info.DefaultHeartbeat while it runs and reaches the API server).
const staleHeartbeat = 3 * info.DefaultHeartbeat

// agentInfoRow is the `get agentinfo` row of a at now: the columns, then
// the wide ones. The conditions of an AgentInfo not written for
// staleHeartbeat are Unknown, not the last ones written: its daemon is
// down, stuck or cut off from the API server (HEARTBEAT says since when).
func agentInfoRow(a *opsv1alpha1.AgentInfo, now time.Time) []any {
	s := a.Status
	hb := s.LastHeartbeatTime
	stale := hb.IsZero() || now.Sub(hb.Time) > staleHeartbeat
	cond := func(typ string) string {
		if stale {
			return string(metav1.ConditionUnknown)
		}
		return condStatus(s.Conditions, typ)
	}
	age := "<unknown>"
	if !hb.IsZero() {
		age = duration.HumanDuration(now.Sub(hb.Time))
	}
	return []any{a.Name, cond(opsv1alpha1.AgentReady), s.Version, s.OVS.Version, s.OVS.DatapathType,
		s.TrafficMode, s.PodCount, s.FlowCount, s.NetworkPolicyCount, age,
		s.TunnelType, s.NodeIP, s.PodCIDR, s.PeerCount, cond(opsv1alpha1.AgentOVSConnected),
		cond(opsv1alpha1.AgentAPIConnected), cond(opsv1alpha1.AgentPoliciesRealized)}
}

func getControllerInfo() *cli.Command {
	return &cli.Command{
		Name: "controllerinfo", Aliases: []string{"controllerinfos", "sci"},
		Usage: "the policy controller: who leads since when, what it computed, how long it took",
		Flags: []cli.Flag{outputFlag()},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			cl, err := cluster(c)
			if err != nil {
				return err
			}
			l, err := cl.ops.OpsV1alpha1().ControllerInfos().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			t := &table{Columns: []string{"NAME", "LEADER", "SINCE", "POLICIES", "APPLIED-TO", "ADDRESS", "LAST-COMPUTATION", "HEARTBEAT"},
				Wide: []string{"VERSION", "INITIAL-SYNC", "QUEUE", "PODS", "NODES"}}
			for _, ci := range l.Items {
				s := ci.Status
				last := "<none>"
				if s.LastComputation != nil {
					last = fmt.Sprintf("%s (%d objects)", s.LastComputation.Duration.Round(time.Millisecond), s.LastComputation.Objects)
				}
				t.add(ci.Name, s.Leader, s.LeaderSince, s.Computed.NetworkPolicies, s.Computed.AppliedToGroups, s.Computed.AddressGroups,
					last, s.LastHeartbeatTime, s.Version, s.InitialSyncDuration.Round(time.Millisecond).String(), s.QueueDepth,
					s.Sources.Pods, s.Sources.Nodes)
			}
			return print(c, l.Items, t)
		},
	}
}

// fromAgentFlag selects the local agent's copy of the computed objects.
func fromAgentFlag() cli.Flag {
	return &cli.BoolFlag{Name: "agent", Usage: "show this Node's agent's copy (and what it installed) instead of the cluster's computed objects"}
}

func getNetworkPolicy() *cli.Command {
	return &cli.Command{
		Name: "networkpolicy", Aliases: []string{"networkpolicies", "netpol", "snp"}, ArgsUsage: "[namespace/name | name | np-<uid>]",
		Usage: "computed NetworkPolicies (controlplane.seine.io): rules, span, realization (a bare name: in the -n namespace, else in any)",
		Flags: []cli.Flag{outputFlag(), fromAgentFlag(), &cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only policies of this namespace"}},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			ref, ns := c.Args().First(), c.String("namespace")
			keep := func(np *cpv1alpha1.NetworkPolicy) bool {
				src := np.Spec.Source
				return (ns == "" || src.Namespace == ns) &&
					(ref == "" || ref == np.Name || ref == src.Namespace+"/"+src.Name || (!strings.Contains(ref, "/") && ref == src.Name))
			}
			notFound := func(where string) error {
				if ns != "" {
					where = fmt.Sprintf(" in namespace %q%s", ns, where)
				}
				return fmt.Errorf("networkpolicy %q not found%s", ref, where)
			}
			if c.Bool("agent") {
				var ps []localapi.AgentPolicy
				if err := local(c).Get(ctx, "/v1/networkpolicies", nil, &ps); err != nil {
					return err
				}
				var out []localapi.AgentPolicy
				t := &table{Columns: []string{"NAME", "SOURCE", "RULES", "TARGETS", "FLOWS", "INSTALLED", "GENERATION"},
					Wide: []string{"APPLIED-TO-GROUP", "POLICY-TYPES", "TARGET-PODS"}}
				for _, p := range ps {
					if !keep(p.Policy) {
						continue
					}
					out = append(out, p)
					src := p.Policy.Spec.Source
					t.add(p.Policy.Name, src.Namespace+"/"+src.Name, len(p.Policy.Spec.Rules), len(p.Targets), p.Flows, p.Installed,
						src.Generation, p.Policy.Spec.AppliedToGroup, p.Policy.Spec.PolicyTypes, p.Targets)
				}
				if ref != "" && len(out) == 0 {
					return notFound(" in this Node's agent")
				}
				return print(c, out, t)
			}
			cl, err := cluster(c)
			if err != nil {
				return err
			}
			l, err := cl.cp.ControlplaneV1alpha1().NetworkPolicies().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			realized := map[string]string{}
			if srcs, err := cl.kube.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{}); err == nil {
				for _, s := range srcs.Items {
					realized["np-"+string(s.UID)] = s.Annotations[info.AnnotationRealizedNodes]
				}
			}
			var out []cpv1alpha1.NetworkPolicy
			t := &table{Columns: []string{"NAME", "SOURCE", "RULES", "NODES", "REALIZED", "GENERATION"},
				Wide: []string{"APPLIED-TO-GROUP", "POLICY-TYPES"}}
			for i := range l.Items {
				np := &l.Items[i]
				if !keep(np) {
					continue
				}
				out = append(out, *np)
				src := np.Spec.Source
				t.add(np.Name, src.Namespace+"/"+src.Name, np.Status.RuleCount, np.Status.SpanSize, realized[np.Name], src.Generation,
					np.Spec.AppliedToGroup, np.Spec.PolicyTypes)
			}
			if ref != "" && len(out) == 0 {
				return notFound("")
			}
			return print(c, out, t)
		},
	}
}

func members(ms []cpv1alpha1.GroupMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Namespace+"/"+m.Name+"("+strings.Join(m.IPs, ",")+")")
	}
	sort.Strings(out)
	return out
}

// groupKind describes one kind of computed group for `get`.
type groupKind[T any] struct {
	name    string
	aliases []string
	usage   string
	path    string // the local API route
	list    func(ctx context.Context, cl *clients) ([]T, error)
	meta    func(T) metav1.Object
	table   *table
	row     func(t *table, g T)
}

// groupCommand is `get <kind> [name] [--agent]` for a group kind.
func groupCommand[T any](k groupKind[T]) *cli.Command {
	return &cli.Command{
		Name: k.name, Aliases: k.aliases, ArgsUsage: "[name | group key]", Usage: k.usage,
		Flags: []cli.Flag{outputFlag(), fromAgentFlag()},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			var items []T
			if c.Bool("agent") {
				if err := local(c).Get(ctx, k.path, nil, &items); err != nil {
					return err
				}
			} else {
				cl, err := cluster(c)
				if err != nil {
					return err
				}
				if items, err = k.list(ctx, cl); err != nil {
					return err
				}
			}
			var out []T
			n := c.Args().First()
			for _, g := range items {
				m := k.meta(g)
				if n != "" && m.GetName() != n && m.GetLabels()[cpv1alpha1.GroupLabel] != n {
					continue
				}
				out = append(out, g)
				k.row(k.table, g)
			}
			if n != "" && len(out) == 0 {
				where := ""
				if c.Bool("agent") {
					where = " in this Node's agent"
				}
				return fmt.Errorf("%s %q not found%s", k.name, n, where)
			}
			return print(c, out, k.table)
		},
	}
}

func getAppliedToGroup() *cli.Command {
	return groupCommand(groupKind[*cpv1alpha1.AppliedToGroup]{
		name: "appliedtogroup", aliases: []string{"appliedtogroups", "atg", "satg"}, path: "/v1/appliedtogroups",
		usage: "AppliedToGroups: the target Pods of policies, one object per group and Node",
		list: func(ctx context.Context, cl *clients) ([]*cpv1alpha1.AppliedToGroup, error) {
			l, err := cl.cp.ControlplaneV1alpha1().AppliedToGroups().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, err
			}
			out := make([]*cpv1alpha1.AppliedToGroup, len(l.Items))
			for i := range l.Items {
				out[i] = &l.Items[i]
			}
			return out, nil
		},
		meta:  func(g *cpv1alpha1.AppliedToGroup) metav1.Object { return g },
		table: &table{Columns: []string{"NAME", "GROUP", "NODE", "MEMBERS"}, Wide: []string{"PODS"}},
		row: func(t *table, g *cpv1alpha1.AppliedToGroup) {
			t.add(g.Name, g.Labels[cpv1alpha1.GroupLabel], g.Spec.NodeName, len(g.Spec.Members), members(g.Spec.Members))
		},
	})
}

func getAddressGroup() *cli.Command {
	return groupCommand(groupKind[*cpv1alpha1.AddressGroup]{
		name: "addressgroup", aliases: []string{"addressgroups", "ag", "sag"}, path: "/v1/addressgroups",
		usage: "AddressGroups: the peer Pods of policy rules, in slices",
		list: func(ctx context.Context, cl *clients) ([]*cpv1alpha1.AddressGroup, error) {
			l, err := cl.cp.ControlplaneV1alpha1().AddressGroups().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, err
			}
			out := make([]*cpv1alpha1.AddressGroup, len(l.Items))
			for i := range l.Items {
				out[i] = &l.Items[i]
			}
			return out, nil
		},
		meta:  func(g *cpv1alpha1.AddressGroup) metav1.Object { return g },
		table: &table{Columns: []string{"NAME", "GROUP", "SLICE", "MEMBERS"}, Wide: []string{"PODS"}},
		row: func(t *table, g *cpv1alpha1.AddressGroup) {
			t.add(g.Name, g.Labels[cpv1alpha1.GroupLabel], g.Spec.Slice, len(g.Spec.Members), members(g.Spec.Members))
		},
	})
}

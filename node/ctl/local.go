package ctl

import (
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/seine-net/seine/datapath/pipeline"
	"github.com/seine-net/seine/node/localapi"
)

func getPodInterface() *cli.Command {
	return &cli.Command{
		Name: "podinterface", Aliases: []string{"podinterfaces", "pi"}, ArgsUsage: "[namespace/name | name]",
		Usage: "the Pods attached to this Node: ofport, IP, MAC, host veth",
		Flags: []cli.Flag{outputFlag(), &cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only Pods of this namespace"}},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			var pis []localapi.PodInterface
			if err := local(c).Get(ctx, "/v1/podinterfaces", nil, &pis); err != nil {
				return err
			}
			ns, ref := c.String("namespace"), c.Args().First()
			var out []localapi.PodInterface
			t := &table{Columns: []string{"NAMESPACE", "NAME", "IP", "MAC", "OFPORT", "VETH"},
				Wide: []string{"CONTAINER-ID", "IFNAME", "INGRESS-ISOLATED", "EGRESS-ISOLATED", "EGRESS-METER"}}
			for _, p := range pis {
				if (ns != "" && p.Namespace != ns) || (ref != "" && ref != p.Name && ref != p.Namespace+"/"+p.Name) {
					continue
				}
				out = append(out, p)
				// The meter's id; <qdisc-only> for a limit without one
				// (seine_pod_egress_limits_without_meter counts them).
				meter := "<none>"
				switch {
				case p.EgressMeter != 0:
					meter = fmt.Sprint(p.EgressMeter)
				case p.EgressLimited:
					meter = "<qdisc-only>"
				}
				t.add(p.Namespace, p.Name, p.IP, p.MAC, p.OFPort, p.HostVeth, shortID(p.ContainerID), p.IfName,
					p.IngressIsolated, p.EgressIsolated, meter)
			}
			if ref != "" && len(out) == 0 {
				return fmt.Errorf("no Pod %q is attached to this Node", ref)
			}
			return print(c, out, t)
		},
	}
}

func getService() *cli.Command {
	return &cli.Command{
		Name: "service", Aliases: []string{"services", "svc"}, ArgsUsage: "[namespace/name | name]",
		Usage: "this Node's Service frontends: addresses, action, endpoints (the Service proxy's view)",
		Description: "One row per frontend, as the Node's Service proxy programmed it: internal (ClusterIPs; externalIPs and\n" +
			"LoadBalancer IPs from Pods), nodeport, external (externalIPs and LoadBalancer IPs routed in by the host), ...;\n" +
			"\"/node\" marks the Node's own connections under externalTrafficPolicy Local. ID is the group and the flows'\n" +
			"owner (get ovsflows --service).",
		Flags: []cli.Flag{outputFlag(), &cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only Services of this namespace"}},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			var fs []localapi.ServiceFrontend
			if err := local(c).Get(ctx, "/v1/services", nil, &fs); err != nil {
				return err
			}
			ns, ref := c.String("namespace"), c.Args().First()
			out := []localapi.ServiceFrontend{}
			t := &table{Columns: []string{"NAMESPACE", "NAME", "PORT", "KIND", "ADDRESSES", "ACTION", "ENDPOINTS"},
				Wide: []string{"ID", "SNAT", "AFFINITY", "SOURCES", "SOURCE-RANGES", "ALIASES"}}
			for _, f := range fs {
				if (ns != "" && f.Namespace != ns) || (ref != "" && ref != f.Name && ref != f.Namespace+"/"+f.Name) {
					continue
				}
				out = append(out, f)
				var aliases []string
				for a, ip := range f.Aliases {
					aliases = append(aliases, a+"="+ip)
				}
				slices.Sort(aliases)
				affinity := "<none>"
				if f.AffinitySeconds > 0 {
					affinity = fmt.Sprintf("%ds", f.AffinitySeconds)
				}
				t.add(f.Namespace, f.Name, f.Port, f.Kind, f.Addresses, f.Action, f.Endpoints,
					f.ID, f.SNAT, affinity, f.Sources, f.SourceRanges, aliases)
			}
			if ref != "" && len(out) == 0 {
				return fmt.Errorf("no Service %q has a frontend on this Node", ref)
			}
			return print(c, out, t)
		},
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// tableNames are the pipeline's tables, for --table and completion.
func tableNames() []string {
	var out []string
	for _, ti := range pipeline.Tables() {
		out = append(out, ti.Name)
	}
	return out
}

func getOVSFlows() *cli.Command {
	return &cli.Command{
		Name: "ovsflows", Aliases: []string{"ovsflow", "flows"},
		Usage: "this Node's OpenFlow entries with their counters, owners and state; by Pod, NetworkPolicy, Service or table",
		Description: "Joins what OVS holds with what Seine wants installed: state \"installed\" (both), \"missing\" (wanted, not in OVS)\n" +
			"or \"unknown\" (in OVS only, e.g. learned affinity flows). Tables: " + strings.Join(tableNames(), ", ") + ".",
		Flags: []cli.Flag{outputFlag(),
			&cli.StringFlag{Name: "pod", Aliases: []string{"p"}, Usage: "the flows of a Pod (namespace/name): its own and those matching its port, IP or MAC"},
			&cli.StringFlag{Name: "networkpolicy", Aliases: []string{"np"}, Usage: "the flows of a NetworkPolicy (namespace/name or np-<uid>)"},
			&cli.StringFlag{Name: "service", Aliases: []string{"svc"}, Usage: "the flows of a Service's frontends (namespace/name)"},
			&cli.StringFlag{Name: "table", Aliases: []string{"T"}, Usage: "one table, by name (" + strings.Join(tableNames(), ", ") + ")"},
		},
		BashComplete: func(c *cli.Context) {
			if n := len(os.Args); n >= 2 && (os.Args[n-2] == "--table" || os.Args[n-2] == "-T") {
				for _, t := range tableNames() {
					fmt.Fprintln(c.App.Writer, t)
				}
				return
			}
			cli.DefaultCompleteWithFlags(c.Command)(c)
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			q := url.Values{}
			if p := c.String("pod"); p != "" {
				ns, name, err := splitRef(p, "default")
				if err != nil {
					return err
				}
				q.Set("pod", ns+"/"+name)
			}
			if v := c.String("networkpolicy"); v != "" {
				q.Set("networkpolicy", v)
			}
			if v := c.String("service"); v != "" {
				ns, name, err := splitRef(v, "default")
				if err != nil {
					return err
				}
				q.Set("service", ns+"/"+name)
			}
			if v := c.String("table"); v != "" {
				q.Set("table", v)
			}
			var flows []localapi.Flow
			if err := local(c).Get(ctx, "/v1/ovsflows", q, &flows); err != nil {
				return err
			}
			t := &table{Columns: []string{"TABLE", "PRIORITY", "PACKETS", "MATCH", "ACTIONS"},
				Wide: []string{"OWNER", "STATE", "BYTES", "COOKIE"}}
			for _, f := range flows {
				actions := f.Actions
				if actions == "" {
					actions = "?"
				}
				t.add(f.Table, f.Priority, f.Packets, f.Match, actions, f.Owner, f.State, f.Bytes, f.Cookie)
			}
			return print(c, flows, t)
		},
	}
}

func logLevelCommand() *cli.Command {
	return &cli.Command{
		Name: "log-level", ArgsUsage: "[debug|info|warn|error]",
		Usage: "show or change the running daemon's log level (not persisted: a restart reads logLevel from the configuration)",
		Flags: []cli.Flag{textOutputFlag()},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			var l localapi.LogLevel
			var err error
			if lvl := c.Args().First(); lvl != "" {
				err = local(c).Put(ctx, "/v1/loglevel", localapi.LogLevel{Level: lvl}, &l)
			} else {
				err = local(c).Get(ctx, "/v1/loglevel", nil, &l)
			}
			if err != nil {
				return err
			}
			if o := c.String("output"); o == "json" || o == "yaml" {
				return print(c, l, nil)
			}
			fmt.Fprintln(c.App.Writer, l.Level)
			return nil
		},
	}
}

// Command sandbox runs the Seine test sandbox: a multi-Node Kubernetes
// cluster on one machine, built from network namespaces, a real control
// plane, per-Node Open vSwitch and seine daemons and a minimal kubelet.
//
//	sandbox up --nodes 3 [--name sbx] [--mode encap|noEncap|hybrid|networkPolicyOnly] [--subnets N] [--set tunnelType=geneve] [--host-link]
//	sandbox status | kubeconfig | down
//	sandbox pod create NS/NAME [--node N] [--labels a=b] [--port http:80/TCP]
//	sandbox pod delete NS/NAME
//	sandbox exec NS/POD -- CMD...
//	sandbox probe NS/POD HOST:PORT/PROTO [--timeout 2s]
//	sandbox ext -- CMD...
//
// Progress goes to stderr; results (pod IP, kubeconfig path, probe
// outcome) to stdout.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tests/sandbox/echo"
	"github.com/seine-net/seine/tests/sandbox/kubelet"
)

func main() {
	app := &cli.App{
		Name:                 "sandbox",
		Usage:                "run a multi-Node Kubernetes sandbox for Seine on this machine",
		EnableBashCompletion: true,
		Commands:             commands(),
	}
	if err := app.Run(interspersed(app.Commands, os.Args)); err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			if msg := ec.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, msg)
			}
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

// commands are the CLI's commands.
func commands() []*cli.Command {
	return []*cli.Command{
		upCommand(), downCommand(), statusCommand(), kubeconfigCommand(),
		podCommand(), execCommand(), nodeExecCommand(), ctlCommand(), probeCommand(), extCommand(),
		demoCommand(), kubeletCommand(), nodeInitCommand(), serveCommand(),
	}
}

// demoCommand creates one demo Pod per Node and prints the Pod-to-Pod
// connectivity table (TCP and UDP between every pair, ICMP-free so it needs
// no tools in the Pods), for a human exploring the sandbox.
func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "create demo Pods (namespace demo), one per Node, and print their connectivity table",
		Flags: sandboxFlags(),
		Action: func(c *cli.Context) error {
			cl, err := load(c)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(c)
			defer cancel()
			ports := []sandbox.Port{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}}
			type demoPod struct{ name, ip, node string }
			var pods []demoPod
			for i, n := range cl.Nodes() {
				name := fmt.Sprintf("web-%d", i+1)
				pod, err := cl.CreatePod(ctx, sandbox.PodSpec{Namespace: "demo", Name: name, Node: n.Name,
					Labels: map[string]string{"app": "web"}, Ports: ports})
				if err != nil {
					return err
				}
				pods = append(pods, demoPod{name, pod.Status.PodIP, n.Name})
				fmt.Printf("demo/%-8s %-12s on %s\n", name, pod.Status.PodIP, n.Name)
			}
			fmt.Printf("\nPod-to-Pod connectivity (TCP 80 / UDP 53; ok = the server answered with its name):\n\n%-10s", "from \\ to")
			for _, to := range pods {
				fmt.Printf(" %-12s", to.name)
			}
			fmt.Println()
			failed := 0
			for _, from := range pods {
				fmt.Printf("%-10s", from.name)
				for _, to := range pods {
					cell := ""
					for _, p := range ports {
						r := cl.Probe(ctx, "demo", from.name, to.ip, int(p.Port), p.Protocol, 2*time.Second)
						if r.Outcome == echo.Connected && r.Reply == to.name {
							cell += "ok/"
						} else {
							cell += "FAIL/"
							failed++
						}
					}
					fmt.Printf(" %-12s", strings.TrimSuffix(cell, "/"))
				}
				fmt.Println()
			}
			fmt.Printf("\nkubectl: export KUBECONFIG=%s\n", cl.Kubeconfig())
			fmt.Printf("probe:   %s probe demo/web-1 %s:80/TCP --name %s\n", os.Args[0], pods[len(pods)-1].ip, cl.Name())
			fmt.Printf("remove:  make sandbox-down\n")
			if failed > 0 {
				return fmt.Errorf("%d probes failed", failed)
			}
			return nil
		},
	}
}

// interspersed moves the flags of the selected (sub)command before its
// positional arguments, so "pod create NS/NAME --node 1" works (urfave/cli
// stops parsing flags at the first positional argument). Arguments after
// "--" are left alone.
func interspersed(cmds []*cli.Command, args []string) []string {
	out := []string{args[0]}
	rest := args[1:]
	var cmd *cli.Command
	for len(rest) > 0 {
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(rest[0]) {
				next = c
			}
		}
		if next == nil {
			break
		}
		cmd = next
		out = append(out, rest[0])
		rest = rest[1:]
		cmds = cmd.Subcommands
	}
	if cmd == nil {
		return args
	}
	isBool := map[string]bool{}
	for _, f := range cmd.Flags {
		if _, ok := f.(*cli.BoolFlag); ok {
			for _, n := range f.Names() {
				isBool[n] = true
			}
		}
	}
	var flags, pos []string
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i:]...)
			break
		}
		if len(a) > 1 && strings.HasPrefix(a, "-") {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && !isBool[name] && i+1 < len(rest) {
				flags = append(flags, rest[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(append(out, flags...), pos...)
}

// common flags of every command that addresses a sandbox.
func sandboxFlags(extra ...cli.Flag) []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "name", Value: sandbox.DefaultName, EnvVars: []string{"SEINE_SANDBOX_NAME"}, Usage: "sandbox name"},
		&cli.StringFlag{Name: "state-root", Value: sandbox.DefaultStateRoot, EnvVars: []string{"SEINE_SANDBOX_STATE_ROOT"}, Usage: "parent of the state directory"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "debug logging"},
	}, extra...)
}

func newLogger(c *cli.Context) *zap.Logger {
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	if c.Bool("verbose") {
		cfg.Level = zap.NewAtomicLevelAt(zapcore.DebugLevel)
	}
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	cfg.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000")
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}

func signalContext(c *cli.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
}

func load(c *cli.Context) (*sandbox.Cluster, error) {
	cl, err := sandbox.Load(c.String("name"), c.String("state-root"))
	if err != nil {
		return nil, err
	}
	cl.SetLogger(newLogger(c))
	return cl, nil
}

func splitKey(s string) (string, string, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return "default", s, nil
	}
	if ns == "" || name == "" {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	return ns, name, nil
}

func parseKV(items []string, what string) (map[string]string, error) {
	out := map[string]string{}
	for _, it := range items {
		for _, kv := range strings.Split(it, ",") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("%s %q: want key=value", what, kv)
			}
			out[k] = v
		}
	}
	return out, nil
}

func upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "build a sandbox and leave it running",
		Flags: sandboxFlags(
			&cli.IntFlag{Name: "nodes", Value: 3, Usage: "number of Nodes"},
			&cli.StringSliceFlag{Name: "set", Usage: "seine daemon config override key=value (value is YAML), repeatable"},
			&cli.BoolFlag{Name: "host-link", Value: true, Usage: "veth to the host and a host kubeconfig (--host-link=false to skip)"},
			&cli.StringFlag{Name: "cni", Value: sandbox.CNIModeSeine, Usage: "CNI: seine, or bridge (Debian plugins, to test the sandbox itself)"},
			&cli.StringFlag{Name: "mode", Value: string(config.ModeEncap), Usage: "seine's traffic mode: encap, noEncap, hybrid or networkPolicyOnly (ptp as the primary CNI, seine chained)"},
			&cli.IntFlag{Name: "subnets", Value: 1, Usage: "transport subnets the Nodes are split over, joined by the underlay router"},
			&cli.BoolFlag{Name: "kubelet", Usage: "real Nodes: kubelet and containerd (`make node-tools`), seine installed by `kubectl apply` of its manifest and image (`make image`)"},
			&cli.StringFlag{Name: "seine", EnvVars: []string{"SEINE_BIN"}, Usage: "seine binary (default: next to this executable)"},
			&cli.StringFlag{Name: "k8s-bin", EnvVars: []string{"SEINE_K8S_BIN"}, Usage: "control-plane binaries directory"},
		),
		Action: func(c *cli.Context) error {
			set, err := parseKV(c.StringSlice("set"), "--set")
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(c)
			defer cancel()
			cl, err := sandbox.Up(ctx, sandbox.Options{
				Name: c.String("name"), Nodes: c.Int("nodes"), Set: set, StateRoot: c.String("state-root"),
				HostLink: c.Bool("host-link"), CNIMode: c.String("cni"), SeineBinary: c.String("seine"),
				Mode: config.TrafficEncapMode(c.String("mode")), Subnets: c.Int("subnets"),
				K8sBinDir: c.String("k8s-bin"), Kubelet: c.Bool("kubelet"), Log: newLogger(c),
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "sandbox %s is up with %d nodes in %d subnet(s), mode %s; kubeconfig: %s\n",
				cl.Name(), len(cl.Nodes()), cl.Subnets(), cl.Mode(), cl.Kubeconfig())
			return nil
		},
	}
}

func downCommand() *cli.Command {
	return &cli.Command{
		Name:  "down",
		Usage: "tear a sandbox down completely (also after a crash)",
		Flags: sandboxFlags(),
		Action: func(c *cli.Context) error {
			if err := sandbox.Down(c.String("name"), c.String("state-root")); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "sandbox %s is down\n", c.String("name"))
			return nil
		},
	}
}

func kubeconfigCommand() *cli.Command {
	return &cli.Command{
		Name:  "kubeconfig",
		Usage: "print the path of the sandbox kubeconfig",
		Flags: sandboxFlags(),
		Action: func(c *cli.Context) error {
			cl, err := load(c)
			if err != nil {
				return err
			}
			fmt.Println(cl.Kubeconfig())
			return nil
		},
	}
}

func liveness(m map[string]bool) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		s := "up"
		if !m[k] {
			s = "DOWN"
		}
		parts = append(parts, k+"="+s)
	}
	return strings.Join(parts, " ")
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show Nodes, addresses, podCIDRs, readiness and process liveness",
		Flags: sandboxFlags(),
		Action: func(c *cli.Context) error {
			cl, err := load(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			fmt.Printf("sandbox %s (cni %s, mode %s, %d transport subnet(s)), state %s\n",
				cl.Name(), cl.CNIMode(), cl.Mode(), cl.Subnets(), cl.StateDir())
			if cl.RealNodes() {
				fmt.Printf("real Nodes (kubelet, containerd); seine installed by kubectl apply -f %s\n", cl.Manifest())
			}
			fmt.Printf("kubeconfig: %s\n", cl.Kubeconfig())
			fmt.Printf("control plane: %s\n", liveness(cl.ControlPlaneProcesses()))
			extNS, extIP := cl.ExternalHost()
			fmt.Printf("external host: %s in %s\n", extIP, extNS)
			apiOK := true
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tIP\tNETNS\tPODCIDR\tREADY\tMODE\tPROCESSES")
			for _, n := range cl.Nodes() {
				cidr, ready := "?", "?"
				if apiOK {
					obj, err := cl.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
					if err != nil {
						fmt.Fprintf(os.Stderr, "apiserver: %v\n", err)
						apiOK = false
					} else {
						cidr, ready = obj.Spec.PodCIDR, "False"
						for _, cond := range obj.Status.Conditions {
							if cond.Type == "Ready" {
								ready = string(cond.Status)
							}
						}
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.IP, n.NetNS, cidr, ready,
					daemonMode(ctx, cl, n), liveness(cl.NodeProcesses(n)))
			}
			return w.Flush()
		},
	}
}

// daemonMode is the traffic mode the Node's seine daemon reports, with
// "noSNAT" when it does not masquerade, or "-" when it cannot be asked.
func daemonMode(ctx context.Context, cl *sandbox.Cluster, n sandbox.Node) string {
	if cl.CNIMode() != sandbox.CNIModeSeine {
		return "-"
	}
	mode, snat, err := cl.DaemonMode(ctx, n.Name)
	if err != nil {
		return "-"
	}
	if !snat {
		mode += ",noSNAT"
	}
	return mode
}

// parsePortFlag parses "[name:]port[/PROTO]".
func parsePortFlag(s string) (sandbox.Port, error) {
	name, rest, ok := strings.Cut(s, ":")
	if !ok {
		name, rest = "", s
	}
	p, err := echo.ParsePort(rest)
	if err != nil {
		return sandbox.Port{}, err
	}
	return sandbox.Port{Name: name, Port: p.Port, Protocol: p.Protocol}, nil
}

func podCommand() *cli.Command {
	return &cli.Command{
		Name:  "pod",
		Usage: "create or delete sandbox Pods",
		Subcommands: []*cli.Command{
			{
				Name:      "create",
				Usage:     "create a Pod with echo servers, wait until Ready, print its IP",
				ArgsUsage: "NAMESPACE/NAME",
				Flags: sandboxFlags(
					&cli.StringFlag{Name: "node", Usage: "Node name or index (default: scheduler decides)"},
					&cli.StringSliceFlag{Name: "labels", Usage: "labels a=b,c=d"},
					&cli.StringSliceFlag{Name: "port", Usage: "container port [name:]port[/TCP|UDP|SCTP], repeatable"},
					&cli.BoolFlag{Name: "host-network", Usage: "run in the Node's network namespace"},
				),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return cli.Exit("usage: sandbox pod create NAMESPACE/NAME [flags]", 2)
					}
					ns, name, err := splitKey(c.Args().First())
					if err != nil {
						return err
					}
					labels, err := parseKV(c.StringSlice("labels"), "--labels")
					if err != nil {
						return err
					}
					var ports []sandbox.Port
					for _, s := range c.StringSlice("port") {
						p, err := parsePortFlag(s)
						if err != nil {
							return err
						}
						ports = append(ports, p)
					}
					cl, err := load(c)
					if err != nil {
						return err
					}
					ctx, cancel := signalContext(c)
					defer cancel()
					pod, err := cl.CreatePod(ctx, sandbox.PodSpec{Namespace: ns, Name: name, Labels: labels,
						Node: c.String("node"), Ports: ports, HostNetwork: c.Bool("host-network")})
					if err != nil {
						return err
					}
					fmt.Fprintf(os.Stderr, "pod %s/%s is Ready on %s\n", ns, name, pod.Spec.NodeName)
					fmt.Println(pod.Status.PodIP)
					return nil
				},
			},
			{
				Name:      "delete",
				Usage:     "delete a Pod and wait until its network namespace is gone",
				ArgsUsage: "NAMESPACE/NAME",
				Flags:     sandboxFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return cli.Exit("usage: sandbox pod delete NAMESPACE/NAME", 2)
					}
					ns, name, err := splitKey(c.Args().First())
					if err != nil {
						return err
					}
					cl, err := load(c)
					if err != nil {
						return err
					}
					ctx, cancel := signalContext(c)
					defer cancel()
					return cl.DeletePod(ctx, ns, name)
				},
			},
		},
	}
}

// execInNetNS replaces this process with `ip netns exec NS argv...`, so
// stdio and the exit code are the command's own.
func execInNetNS(netns string, argv []string) error {
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return cli.Exit("no command given (use: -- CMD ARGS...)", 2)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return fmt.Errorf("find ip: %w", err)
	}
	return syscall.Exec(ip, append([]string{"ip", "netns", "exec", netns}, argv...), os.Environ())
}

func execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command inside a Pod's network namespace",
		ArgsUsage: "NAMESPACE/POD -- CMD...",
		Flags:     sandboxFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 {
				return cli.Exit("usage: sandbox exec NAMESPACE/POD -- CMD...", 2)
			}
			ns, name, err := splitKey(c.Args().First())
			if err != nil {
				return err
			}
			cl, err := load(c)
			if err != nil {
				return err
			}
			st, err := cl.PodState(ns, name)
			if err != nil {
				return err
			}
			netns := st.NetNS
			if st.HostNetwork {
				n, err := cl.Node(st.Node)
				if err != nil {
					return err
				}
				netns = n.NetNS
			}
			return execInNetNS(netns, c.Args().Slice()[1:])
		},
	}
}

func nodeExecCommand() *cli.Command {
	return &cli.Command{
		Name:      "node-exec",
		Usage:     "run a command inside a Node's network namespace",
		ArgsUsage: "NODE -- CMD...",
		Flags:     sandboxFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 {
				return cli.Exit("usage: sandbox node-exec NODE -- CMD...", 2)
			}
			_, n, err := loadNode(c)
			if err != nil {
				return err
			}
			return execInNetNS(n.NetNS, c.Args().Slice()[1:])
		},
	}
}

// loadNode loads the sandbox and the Node named by the first argument.
func loadNode(c *cli.Context) (*sandbox.Cluster, sandbox.Node, error) {
	cl, err := load(c)
	if err != nil {
		return nil, sandbox.Node{}, err
	}
	n, err := cl.Node(c.Args().First())
	return cl, n, err
}

func ctlCommand() *cli.Command {
	return &cli.Command{
		Name:      "ctl",
		Usage:     "run seinectl on a Node (its API socket, the sandbox's kubeconfig)",
		ArgsUsage: "NODE -- SEINECTL-ARGS...",
		Flags:     sandboxFlags(),
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 {
				return cli.Exit("usage: sandbox ctl NODE -- SEINECTL-ARGS...", 2)
			}
			cl, n, err := loadNode(c)
			if err != nil {
				return err
			}
			seine, err := os.Executable()
			if err != nil {
				return err
			}
			args := c.Args().Slice()[1:]
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			argv := append([]string{filepath.Join(filepath.Dir(seine), "seinectl"), "--socket", n.APISocket,
				"--kubeconfig", cl.InternalKubeconfig()}, args...)
			return execInNetNS(n.NetNS, argv)
		},
	}
}

func extCommand() *cli.Command {
	return &cli.Command{
		Name:      "ext",
		Usage:     "run a command inside the external host's network namespace (198.19.0.10)",
		ArgsUsage: "-- CMD...",
		Flags:     sandboxFlags(),
		Action: func(c *cli.Context) error {
			cl, err := load(c)
			if err != nil {
				return err
			}
			ns, _ := cl.ExternalHost()
			return execInNetNS(ns, c.Args().Slice())
		},
	}
}

// parseTarget parses "HOST:PORT[/PROTO]".
func parseTarget(s string) (string, int, echo.Port, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, echo.Port{}, fmt.Errorf("target %q: want HOST:PORT[/PROTO]", s)
	}
	p, err := echo.ParsePort(s[i+1:])
	if err != nil {
		return "", 0, echo.Port{}, err
	}
	host := strings.Trim(s[:i], "[]")
	return host, int(p.Port), p, nil
}

func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "connect from a Pod (or --from-node/--from-ext) and print connected <reply>, refused, timed out or probe failed",
		ArgsUsage: "NAMESPACE/POD HOST:PORT[/PROTO]",
		Flags: sandboxFlags(
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Second},
			&cli.StringFlag{Name: "from-node", Usage: "probe from this Node's network namespace (its host) instead of a Pod"},
			&cli.BoolFlag{Name: "from-ext", Usage: "probe from the external host instead of a Pod"},
		),
		Action: func(c *cli.Context) error {
			if c.String("from-node") != "" && c.Bool("from-ext") {
				return cli.Exit("probe: --from-node and --from-ext exclude each other", 2)
			}
			fromHost := c.String("from-node") != "" || c.Bool("from-ext")
			if want := map[bool]int{false: 2, true: 1}[fromHost]; c.NArg() != want {
				return cli.Exit("usage: sandbox probe [--timeout 2s] NAMESPACE/POD HOST:PORT[/PROTO], or --from-node NODE / --from-ext HOST:PORT[/PROTO]", 2)
			}
			host, port, p, err := parseTarget(c.Args().Get(c.NArg() - 1))
			if err != nil {
				return err
			}
			cl, err := load(c)
			if err != nil {
				return err
			}
			var res sandbox.ProbeResult
			switch {
			case c.Bool("from-ext"):
				netns, _ := cl.ExternalHost()
				res = cl.ProbeFrom(c.Context, netns, host, port, p.Protocol, c.Duration("timeout"))
			case fromHost:
				node, err := cl.Node(c.String("from-node"))
				if err != nil {
					return err
				}
				res = cl.ProbeFrom(c.Context, node.NetNS, host, port, p.Protocol, c.Duration("timeout"))
			default:
				ns, name, err := splitKey(c.Args().First())
				if err != nil {
					return err
				}
				res = cl.Probe(c.Context, ns, name, host, port, p.Protocol, c.Duration("timeout"))
			}
			fmt.Println(res.String())
			if res.Outcome != sandbox.Connected {
				if res.Err != nil && c.Bool("verbose") {
					fmt.Fprintln(os.Stderr, res.Err)
				}
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

func nodeInitCommand() *cli.Command {
	return &cli.Command{
		Name:   "node-init",
		Hidden: true,
		Usage:  "set up a real Node's mount namespace and hold it (started by up --kubelet)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Required: true, Usage: "the Node's state directory"},
			&cli.StringFlag{Name: "hostname", Required: true, Usage: "the Node's host name (its Node name)"},
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext(c)
			defer cancel()
			return sandbox.NodeInit(ctx, c.String("dir"), c.String("hostname"), newLogger(c))
		},
	}
}

func kubeletCommand() *cli.Command {
	return &cli.Command{
		Name:   "kubelet",
		Hidden: true,
		Usage:  "run the sandbox kubelet of one Node (started by up inside the Node's netns)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Required: true},
			&cli.StringFlag{Name: "node", Required: true},
			&cli.StringFlag{Name: "node-ip", Required: true},
			&cli.StringFlag{Name: "kubeconfig", Required: true},
			&cli.StringFlag{Name: "cni-bin-dir"},
			&cli.StringFlag{Name: "cni-conf-dir", Required: true},
			&cli.StringFlag{Name: "cni-cache-dir"},
			&cli.StringFlag{Name: "pod-state-dir", Required: true},
			&cli.BoolFlag{Name: "verbose"},
		},
		Action: func(c *cli.Context) error {
			log := newLogger(c)
			k, err := kubelet.New(kubelet.Config{
				Sandbox: c.String("name"), NodeName: c.String("node"), NodeIP: c.String("node-ip"),
				Kubeconfig: c.String("kubeconfig"), CNIBinDir: c.String("cni-bin-dir"),
				CNIConfDir: c.String("cni-conf-dir"), CNICacheDir: c.String("cni-cache-dir"),
				PodStateDir: c.String("pod-state-dir"),
			}, log)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext(c)
			defer cancel()
			err = k.Run(ctx)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
}

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:   "serve",
		Hidden: true,
		Usage:  "run echo servers in the current netns until interrupted (e.g. sandbox ext -- sandbox serve --port 80)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "reply", Value: "external", Usage: "reply line"},
			&cli.StringSliceFlag{Name: "port", Usage: "port[/PROTO], repeatable", Required: true},
		},
		Action: func(c *cli.Context) error {
			var ports []echo.Port
			for _, s := range c.StringSlice("port") {
				p, err := echo.ParsePort(s)
				if err != nil {
					return err
				}
				ports = append(ports, p)
			}
			log := newLogger(c)
			srv, err := echo.Serve("", c.String("reply"), ports, log)
			if err != nil {
				return err
			}
			defer srv.Close()
			log.Info("serving", zap.Strings("ports", c.StringSlice("port")), zap.String("reply", c.String("reply")))
			ctx, cancel := signalContext(c)
			defer cancel()
			<-ctx.Done()
			return nil
		},
	}
}

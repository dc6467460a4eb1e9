// Package ctl is seinectl, the operators' command-line client. It talks to
// the seine daemon of the Node it runs on through the daemon's local API
// (a root-only unix socket, see node/localapi) and to the cluster through
// a kubeconfig, as kubectl does. `seinectl` (the busybox name of the seine
// binary) and `seine ctl` run it.
//
// Output is a table (or text) by default; -o wide adds columns to a table,
// -o json and -o yaml print the objects; any other -o is refused. Flags,
// the global --socket and --kubeconfig included, may follow arguments, as
// with kubectl.
package ctl

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	opsclient "github.com/seine-net/seine/node/client/clientset/versioned"
	"github.com/seine-net/seine/node/localapi"
	"github.com/seine-net/seine/node/version"
	cpclient "github.com/seine-net/seine/policy/client/clientset/versioned"
)

// NewApp returns the seinectl application.
func NewApp() *cli.App {
	return &cli.App{
		Name:                 "seinectl",
		Usage:                "inspect and debug Seine",
		Version:              version.Version(),
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: localapi.DefaultSocket, EnvVars: []string{"SEINE_API_SOCKET"},
				Usage: "the local seine daemon's API socket (root only)"},
			&cli.StringFlag{Name: "kubeconfig",
				Usage: "kubeconfig file for the cluster (default: $KUBECONFIG, a list of files merged as kubectl does; else in-cluster, then ~/.kube/config)"},
		},
		Commands: []*cli.Command{
			versionCommand(),
			getCommand(),
			traceCommand(),
			queryCommand(),
			traceflowCommand(),
			logLevelCommand(),
			supportBundleCommand(),
			completionCommand(),
		},
	}
}

// Main runs seinectl with args (args[0] is the program name) and returns
// the process exit status.
func Main(args []string) int {
	// SIGINT and SIGTERM cancel the command's context, so that it can
	// clean up (traceflow deletes its Traceflow); a second one kills.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()
	app := NewApp()
	if err := app.RunContext(ctx, interspersed(app, args)); err != nil {
		fmt.Fprintln(os.Stderr, "seinectl:", err)
		return 1
	}
	return 0
}

// local returns the client of the local daemon's API.
func local(c *cli.Context) *localapi.Client {
	return localapi.NewClient(c.String("socket"))
}

// clients are the cluster's API clients.
type clients struct {
	kube kubernetes.Interface
	cp   cpclient.Interface
	ops  opsclient.Interface
}

// clientsKey in App.Metadata holds *clients to use instead of building
// them from the kubeconfig.
const clientsKey = "seinectl.clients"

// cluster builds the cluster clients, configured like kubectl's: the
// --kubeconfig file, else the files $KUBECONFIG lists (merged), else
// in-cluster, else ~/.kube/config.
func cluster(c *cli.Context) (*clients, error) {
	if cl, ok := c.App.Metadata[clientsKey].(*clients); ok {
		return cl, nil // set by tests
	}
	rc, err := restConfig(c.String("kubeconfig"))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "seinectl/" + version.Version()
	out := &clients{}
	if out.kube, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if out.cp, err = cpclient.NewForConfig(rc); err != nil {
		return nil, err
	}
	if out.ops, err = opsclient.NewForConfig(rc); err != nil {
		return nil, err
	}
	return out, nil
}

// restConfig is the configuration of the cluster: the file explicit (the
// flag) if set, else client-go's default loading rules ($KUBECONFIG, a
// list merged in order, else ~/.kube/config), in-cluster before
// ~/.kube/config when neither is set.
func restConfig(explicit string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = explicit
	if explicit == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		if rc, err := rest.InClusterConfig(); err == nil {
			return rc, nil
		}
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// splitRef splits "namespace/name"; a bare name takes namespace def.
func splitRef(ref, def string) (string, string, error) {
	if ref == "" {
		return "", "", fmt.Errorf("empty Pod reference")
	}
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return def, ref, nil
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want namespace/name", ref)
	}
	return ns, name, nil
}

// interspersed moves the flags that follow a leaf command's arguments in
// front of them, so that `seinectl get agentinfo n1 -o wide` parses as
// kubectl users expect (urfave/cli stops at the first argument), and the
// application's own flags (--socket, --kubeconfig) given after a command
// in front of the commands, where urfave/cli looks for them.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	const complete = "--generate-bash-completion"
	tail := []string(nil)
	if args[len(args)-1] == complete {
		args, tail = args[:len(args)-1], []string{complete}
	}
	out := []string{args[0]}
	var global []string // the application's flags met after a command
	cmds, flags := app.Commands, app.Flags
	atRoot := true
	i := 1
	// take moves the flag args[i], and its value, to dst, or to global if
	// it is the application's and not also the current command's.
	take := func(dst *[]string) {
		a, fs := args[i], flags
		if !atRoot && flagNamed(flags, a) == nil && flagNamed(app.Flags, a) != nil {
			dst, fs = &global, app.Flags
		}
		*dst = append(*dst, a)
		if takesValue(fs, a) && i+1 < len(args) {
			*dst = append(*dst, args[i+1])
			i++
		}
		i++
	}
	takeFlags := func() {
		for i < len(args) && isFlag(args[i]) {
			take(&out)
		}
	}
	takeFlags()
	atRoot = false
	rootEnd := len(out)
	var leaf *cli.Command
	for i < len(args) {
		var c *cli.Command
		for _, cand := range cmds {
			if cand.HasName(args[i]) {
				c = cand
			}
		}
		if c == nil {
			break
		}
		out = append(out, args[i])
		i++
		leaf, cmds, flags = c, c.Subcommands, c.Flags
		if len(c.Subcommands) == 0 {
			break
		}
		takeFlags()
	}
	if leaf == nil || leaf.SkipFlagParsing || len(leaf.Subcommands) > 0 {
		return append(args, tail...)
	}
	var fl, pos []string
	for i < len(args) {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if isFlag(a) {
			take(&fl)
			continue
		}
		pos = append(pos, a)
		i++
	}
	out = append(out[:rootEnd:rootEnd], append(global, out[rootEnd:]...)...)
	out = append(append(out, fl...), pos...)
	return append(out, tail...)
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' && a != "--" }

// flagNamed is the flag of flags that a (-name, --name or --name=value)
// names, or nil.
func flagNamed(flags []cli.Flag, a string) cli.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// takesValue reports whether flag a (without "=value") expects a value.
func takesValue(flags []cli.Flag, a string) bool {
	if strings.Contains(a, "=") {
		return false
	}
	f := flagNamed(flags, a)
	_, isBool := f.(*cli.BoolFlag)
	return f != nil && !isBool
}

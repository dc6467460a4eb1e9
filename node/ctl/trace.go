package ctl

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1alpha1 "github.com/seine-net/seine/node/apis/ops/v1alpha1"
	opsclient "github.com/seine-net/seine/node/client/clientset/versioned/typed/ops/v1alpha1"
	"github.com/seine-net/seine/node/localapi"
)

func traceCommand() *cli.Command {
	return &cli.Command{
		Name:  "trace-packet",
		Usage: "trace a packet from a Pod of this Node through its pipeline (ofproto/trace); print the verdict and the tables passed",
		Description: "The packet is simulated, the connection taken as new. Examples:\n" +
			"  seinectl trace-packet -S default/client -D default/server -f tcp,tcp_dst=80\n" +
			"  seinectl trace-packet -S default/client -D 10.96.0.10 -f udp,udp_dst=53\n" +
			"A destination on another Node is traced up to the tunnel: its ingress policy runs there (see seinectl traceflow).",
		Flags: []cli.Flag{textOutputFlag(),
			&cli.StringFlag{Name: "source", Aliases: []string{"S"}, Required: true, Usage: "the sending Pod, namespace/name (on this Node)"},
			&cli.StringFlag{Name: "destination", Aliases: []string{"D"}, Required: true, Usage: "a Pod (namespace/name) or an IPv4 address"},
			&cli.StringFlag{Name: "flow", Aliases: []string{"f"}, Usage: "more flow fields in ovs-ofctl(8) syntax, e.g. tcp,tcp_dst=80 (default: an ICMP echo request)"},
			&cli.BoolFlag{Name: "full", Usage: "also print the whole ofproto/trace output"},
		},
		Action: func(c *cli.Context) error {
			ctx, cancel := timeout(c)
			defer cancel()
			src, err := podRef(c.String("source"))
			if err != nil {
				return err
			}
			dst := c.String("destination")
			if net.ParseIP(dst) == nil {
				if dst, err = podRef(dst); err != nil {
					return err
				}
			}
			var res localapi.TraceResult
			if err := local(c).Post(ctx, "/v1/trace-packet", localapi.TraceRequest{Source: src, Destination: dst, Flow: c.String("flow")}, &res); err != nil {
				return err
			}
			if o := c.String("output"); o == "json" || o == "yaml" {
				return print(c, res, nil)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "Node:     %s\nFlow:     %s\nTables:   %s\nVerdict:  %s: %s\n", res.Node, res.Flow,
				strings.Join(res.Tables, " → "), res.Verdict, res.Detail)
			if c.Bool("full") {
				fmt.Fprintf(w, "\n%s", res.Output)
			}
			return nil
		},
	}
}

// podRef completes a bare Pod name with the default namespace.
func podRef(ref string) (string, error) {
	ns, name, err := splitRef(ref, "default")
	if err != nil {
		return "", err
	}
	return ns + "/" + name, nil
}

func traceflowCommand() *cli.Command {
	return &cli.Command{
		Name:      "traceflow",
		ArgsUsage: "",
		Usage:     "inject a real packet at a Pod's port and follow it across Nodes (creates an ops.seine.io Traceflow)",
		Description: "Examples:\n" +
			"  seinectl traceflow -S default/client -D default/server            (ICMP echo)\n" +
			"  seinectl traceflow -S default/client -D default/server:80         (TCP SYN to port 80)\n" +
			"  seinectl traceflow -S default/client -D 10.96.0.10:53 --protocol UDP\n" +
			"Works from anywhere the kubeconfig reaches: the source Pod's Node injects the packet.",
		Flags: []cli.Flag{textOutputFlag(),
			&cli.StringFlag{Name: "source", Aliases: []string{"S"}, Required: true, Usage: "the sending Pod, namespace/name"},
			&cli.StringFlag{Name: "destination", Aliases: []string{"D"}, Required: true, Usage: "namespace/name or IPv4 address, with an optional :port"},
			&cli.StringFlag{Name: "protocol", Usage: "ICMP, TCP or UDP (default ICMP, or TCP with a port)"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long the trace may take: whole seconds, at least 1s (a fraction rounds up)"},
			&cli.BoolFlag{Name: "keep", Usage: "keep the Traceflow object (default: delete it once done)"},
		},
		Action: runTraceflow,
	}
}

func parseDestination(s string) (opsv1alpha1.TraceflowDestination, int32, error) {
	var port int32
	if i := strings.LastIndex(s, ":"); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return opsv1alpha1.TraceflowDestination{}, 0, fmt.Errorf("destination %q: bad port", s)
		}
		port, s = int32(p), s[:i]
	}
	if ip := net.ParseIP(s); ip != nil {
		return opsv1alpha1.TraceflowDestination{IP: s}, port, nil
	}
	ns, name, err := splitRef(s, "default")
	if err != nil {
		return opsv1alpha1.TraceflowDestination{}, 0, err
	}
	return opsv1alpha1.TraceflowDestination{Namespace: ns, Pod: name}, port, nil
}

// traceflowGrace is how long past the trace's timeout seinectl waits for
// the source Node to write the final phase.
const traceflowGrace = 5 * time.Second

// deleteTimeout bounds deleting the Traceflow once seinectl is done with it,
// also after an interrupt (the command's context is cancelled then).
const deleteTimeout = 10 * time.Second

// apiCallTimeout bounds each other API call of seinectl traceflow
// (client-go sets none), so an API server that does not answer fails the
// command instead of hanging it.
const apiCallTimeout = 10 * time.Second

// timeoutSeconds turns --timeout into the Traceflow's timeoutSeconds: the
// API counts whole seconds, so a fraction rounds up and less than 1s is
// refused (0 would mean the Node's default of 10s).
func timeoutSeconds(d time.Duration) (int32, error) {
	if d < time.Second {
		return 0, fmt.Errorf("--timeout %s: a Traceflow's timeout is whole seconds, at least 1s", d)
	}
	secs := (d + time.Second - 1) / time.Second
	if secs > math.MaxInt32 {
		return 0, fmt.Errorf("--timeout %s: at most %ds", d, math.MaxInt32)
	}
	return int32(secs), nil
}

func runTraceflow(c *cli.Context) error {
	sns, sname, err := splitRef(c.String("source"), "default")
	if err != nil {
		return err
	}
	dst, port, err := parseDestination(c.String("destination"))
	if err != nil {
		return err
	}
	proto := strings.ToUpper(c.String("protocol"))
	if proto == "" {
		proto = opsv1alpha1.ProtocolICMP
		if port != 0 {
			proto = opsv1alpha1.ProtocolTCP
		}
	}
	secs, err := timeoutSeconds(c.Duration("timeout"))
	if err != nil {
		return err
	}
	cl, err := cluster(c)
	if err != nil {
		return err
	}
	ctx := c.Context
	tfs := cl.ops.OpsV1alpha1().Traceflows()
	cctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	tf, err := tfs.Create(cctx, &opsv1alpha1.Traceflow{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tf-" + sname + "-"},
		Spec: opsv1alpha1.TraceflowSpec{Source: opsv1alpha1.TraceflowSource{Namespace: sns, Pod: sname}, Destination: dst,
			Packet: opsv1alpha1.TraceflowPacket{Protocol: proto, DstPort: port}, TimeoutSeconds: secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the Traceflow: %w", err)
	}
	if name := tf.Name; !c.Bool("keep") {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
			defer cancel()
			if err := tfs.Delete(dctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				fmt.Fprintf(c.App.ErrWriter, "seinectl: deleting Traceflow %s: %v (kubectl delete stf %s removes it)\n", name, err, name)
			}
		}()
	}
	wait := time.Duration(secs)*time.Second + traceflowGrace
	if tf, err = waitTraceflow(ctx, tfs, tf, time.Now().Add(wait)); err != nil {
		return err
	}
	if tf.Status.Phase == "" {
		return fmt.Errorf("traceflow %s: no Node started it within %s: is Pod %s/%s running on a Node with seine?", tf.Name, wait, sns, sname)
	}
	if o := c.String("output"); o == "json" || o == "yaml" {
		if err := print(c, tf, nil); err != nil {
			return err
		}
	} else {
		writeTraceflow(c, tf)
	}
	return traceflowOutcome(tf, wait)
}

// waitTraceflow polls tf until its phase is final or until passes; it
// returns the last version read.
func waitTraceflow(ctx context.Context, tfs opsclient.TraceflowInterface, tf *opsv1alpha1.Traceflow, until time.Time) (*opsv1alpha1.Traceflow, error) {
	for {
		gctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
		cur, err := tfs.Get(gctx, tf.Name, metav1.GetOptions{})
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("traceflow %s: %w", tf.Name, context.Cause(ctx))
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("traceflow %s was deleted before it finished", tf.Name)
		case err != nil:
			return nil, fmt.Errorf("reading traceflow %s: %w", tf.Name, err)
		}
		tf = cur
		if p := tf.Status.Phase; p == opsv1alpha1.TraceflowSucceeded || p == opsv1alpha1.TraceflowFailed || !time.Now().Before(until) {
			return tf, nil
		}
		t := time.NewTimer(min(200*time.Millisecond, time.Until(until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("traceflow %s: %w", tf.Name, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// traceflowOutcome is nil for a Succeeded trace and otherwise says why it
// did not succeed: Failed with the Node's reason, or still running when
// seinectl stopped waiting, after waited.
func traceflowOutcome(tf *opsv1alpha1.Traceflow, waited time.Duration) error {
	switch st := tf.Status; st.Phase {
	case opsv1alpha1.TraceflowSucceeded:
		return nil
	case opsv1alpha1.TraceflowFailed:
		return fmt.Errorf("traceflow %s failed: %s", tf.Name, st.Reason)
	default:
		return fmt.Errorf("traceflow %s: phase still %s after %s: its source Node %s did not finish it (is that Node's seine daemon running?)",
			tf.Name, st.Phase, waited, st.SourceNode)
	}
}

func writeTraceflow(c *cli.Context, tf *opsv1alpha1.Traceflow) {
	w := c.App.Writer
	st := tf.Status
	fmt.Fprintf(w, "Traceflow %s: %s/%s", tf.Name, tf.Spec.Source.Namespace, tf.Spec.Source.Pod)
	if p := st.Packet; p != nil {
		fmt.Fprintf(w, " (%s) -> %s %s", p.SrcIP, p.DstIP, p.Protocol)
		if p.DstPort != 0 {
			fmt.Fprintf(w, " %d->%d", p.SrcPort, p.DstPort)
		}
	}
	fmt.Fprintln(w)
	for _, n := range st.Nodes {
		fmt.Fprintf(w, "Node %s: %s\n  %s: %s\n", n.Node, strings.Join(n.Tables, " → "), n.Action, n.Detail)
	}
	switch st.Phase {
	case opsv1alpha1.TraceflowSucceeded:
		fmt.Fprintf(w, "Result: %s\n", st.Result)
	default:
		fmt.Fprintf(w, "Phase: %s %s\n", st.Phase, st.Reason)
	}
}

func supportBundleCommand() *cli.Command {
	return &cli.Command{
		Name:  "supportbundle",
		Usage: "collect this Node's logs, configuration, OVS ports/flows/groups, routes, nftables rules, connection tracking, policy state and profiles into one archive",
		Flags: []cli.Flag{&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "archive path (default: seine-<node>-<time>.tar.gz here)"}},
		Action: func(c *cli.Context) error {
			ctx, cancel := context.WithTimeout(c.Context, localapi.ReadTimeout)
			defer cancel()
			path := c.String("file")
			if path == "" {
				var v localapi.Version
				if err := local(c).Get(ctx, "/v1/version", nil, &v); err != nil {
					return err
				}
				path = fmt.Sprintf("seine-%s-%s.tar.gz", v.Node, time.Now().UTC().Format("20060102T150405Z"))
			}
			tmp, err := os.CreateTemp(filepath.Dir(path), ".seine-bundle-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if err := local(c).Stream(ctx, "/v1/supportbundle", tmp); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), path); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, path)
			return nil
		},
	}
}

package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"

	"github.com/seine-net/seine/node/config"
)

// Traffic modes in the sandbox. Every mode runs seine on every Node; what
// differs is the network around it:
//
//   - encap: nothing else;
//   - noEncap, hybrid: the router has a static route to every Node's
//     podCIDR via the Node (standing for a cloud route controller or BGP),
//     so Pods in other subnets, and the external host, reach Pods;
//   - networkPolicyOnly: the Nodes' primary CNI is Debian's ptp plugin
//     with host-local IPAM over the Node's podCIDR (a routed primary: a
//     point-to-point veth and a host route per Pod), seine chained after
//     it; each Node has the routes such a setup gives: a route to every
//     same-subnet peer's podCIDR via the peer, and the router one to
//     every podCIDR.

// maxSubnets bounds Options.Subnets (198.18.255.0/24 is the host link's).
const maxSubnets = 8

// modeDefaults fills and checks Mode and Subnets.
func (o *Options) modeDefaults() error {
	if o.Mode == "" {
		o.Mode = config.ModeEncap
	}
	if !o.Mode.Valid() {
		return fmt.Errorf("mode %q: want one of %v", o.Mode, config.Modes())
	}
	if o.Subnets == 0 {
		o.Subnets = 1
	}
	if o.Subnets < 1 || o.Subnets > maxSubnets || o.Subnets > o.Nodes {
		return fmt.Errorf("subnets %d: want 1..%d and at most the number of Nodes (%d)", o.Subnets, maxSubnets, o.Nodes)
	}
	if o.Mode == config.ModeNetworkPolicyOnly && o.CNIMode != CNIModeSeine {
		return fmt.Errorf("mode %s needs CNI mode %s", o.Mode, CNIModeSeine)
	}
	if o.Kubelet && o.Mode != config.ModeEncap {
		return fmt.Errorf("mode %s: real Nodes (kubelet) run seine's manifest, which sets no traffic mode yet; use the sandbox's own kubelets", o.Mode)
	}
	return nil
}

// routePodCIDRs installs the routes to the Nodes' podCIDRs (Node name →
// podCIDR) that the mode expects of the network: none for encap; on the
// router for the other modes; and, for networkPolicyOnly, on each Node to
// its same-subnet peers.
func (c *Cluster) routePodCIDRs(ctx context.Context, cidrs map[string]string) error {
	if c.Mode() == config.ModeEncap || c.st.CNIMode != CNIModeSeine {
		return nil
	}
	b := &builder{ctx: ctx}
	u := underlayNS(c.st.Name)
	for _, n := range c.st.Nodes {
		b.ip("-n", u, "route", "replace", cidrs[n.Name], "via", n.IP)
		if c.Mode() != config.ModeNetworkPolicyOnly {
			continue
		}
		for _, p := range c.st.Nodes {
			if p.Name != n.Name && p.Subnet == n.Subnet {
				b.ip("-n", n.NetNS, "route", "replace", cidrs[p.Name], "via", p.IP)
			}
		}
	}
	if b.err != nil {
		return fmt.Errorf("routes to podCIDRs: %w", b.err)
	}
	return nil
}

// primaryConflist is the path of the primary CNI's conflist of a Node in
// networkPolicyOnly mode.
func primaryConflist(n *Node) string { return filepath.Join(n.CNIConfDir, "10-ptp.conflist") }

// PrimaryConflist returns the ptp-only conflist a networkPolicyOnly Node's
// primary CNI started from (seine not chained), for tests that call the
// primary alone.
func PrimaryConflist(podCIDR string, n Node) ([]byte, error) {
	return hostLocalConflist("sandbox-routed", map[string]any{"type": "ptp", "ipMasq": false, "mtu": 1500}, podCIDR, n)
}

// installChained writes the Node's primary conflist (ptp) and chains seine
// into it with `seine install-cni --chain-into`, as a DaemonSet's init
// container would.
func (c *Cluster) installChained(ctx context.Context, n *Node, podCIDR string) error {
	b, err := PrimaryConflist(podCIDR, *n)
	if err != nil {
		return err
	}
	p := primaryConflist(n)
	if err := writeConflist(p, b); err != nil {
		return err
	}
	c.log.Info("chaining seine after ptp", zap.String("node", n.Name), zap.String("conflist", p))
	if _, err := run(ctx, nil, c.st.SeineBinary, "install-cni", "--cni-bin-dir", n.CNIBinDir,
		"--cni-socket", n.CNISocket, "--chain-into", p); err != nil {
		return fmt.Errorf("install CNI: %w", err)
	}
	return nil
}

// InstalledConflist returns the path of the conflist the Node's kubelet
// uses: seine's own, or in networkPolicyOnly mode the primary's.
func (c *Cluster) InstalledConflist(n Node) string {
	if c.Mode() == config.ModeNetworkPolicyOnly {
		return primaryConflist(&n)
	}
	return filepath.Join(n.CNIConfDir, "10-seine.conflist")
}

// UnderlayExec runs argv in the underlay namespace (its bridges and the
// router between the transport subnets).
func (c *Cluster) UnderlayExec(ctx context.Context, argv ...string) ([]byte, error) {
	return execIn(ctx, underlayNS(c.st.Name), argv)
}

// Capture is a running tcpdump on the underlay port of one Node.
type Capture struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string
	done chan struct{}
}

// CaptureUnderlay starts tcpdump (numeric, one line per packet) on the
// underlay side of the Node's transport link, with a pcap-filter(7)
// expression, and returns once it listens. Stop it with Stop.
func (c *Cluster) CaptureUnderlay(ctx context.Context, node, filter string) (*Capture, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	args := []string{"netns", "exec", underlayNS(c.st.Name), "tcpdump", "--immediate-mode", "-i", fmt.Sprintf("n%d", n.Index), "-nn", "-l", "-Q", "in"}
	if filter != "" {
		args = append(args, filter)
	}
	cmd := exec.Command("ip", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("tcpdump: %w", err)
	}
	cp := &Capture{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(cp.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			cp.mu.Lock()
			cp.out = append(cp.out, sc.Text())
			cp.mu.Unlock()
		}
	}()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				ready <- nil
				_, _ = io.Copy(io.Discard, stderr)
				return
			}
		}
		ready <- errors.New("tcpdump ended before listening")
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(10 * time.Second):
		err = errors.New("tcpdump did not start listening in 10 s")
	}
	if err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

// Stop ends the capture and returns its lines.
func (cp *Capture) Stop() []string {
	_ = cp.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-cp.done:
	case <-time.After(5 * time.Second):
		_ = cp.cmd.Process.Kill()
		<-cp.done
	}
	_ = cp.cmd.Wait()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]string(nil), cp.out...)
}

// NodeMetrics fetches the seine daemon's /metrics from inside the Node's
// namespace (metricsAddress ":9345", the default: the Node's IP).
func (c *Cluster) NodeMetrics(ctx context.Context, node string) (string, error) {
	n, err := c.Node(node)
	if err != nil {
		return "", err
	}
	var conn net.Conn
	err = ns.WithNetNSPath(netnsPath(n.NetNS), func(ns.NetNS) error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(n.IP, "9345"))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", n.Name, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: "+n.IP+"\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

var modeMetricRE = regexp.MustCompile(`seine_traffic_mode_info\{[^}]*mode="([^"]+)"[^}]*snat="([^"]+)"`)

// DaemonMode returns the traffic mode the Node's running seine daemon
// reports (its seine_traffic_mode_info metric) and whether it
// masquerades Pod traffic.
func (c *Cluster) DaemonMode(ctx context.Context, node string) (mode string, snat bool, err error) {
	m, err := c.NodeMetrics(ctx, node)
	if err != nil {
		return "", false, err
	}
	sub := modeMetricRE.FindStringSubmatch(m)
	if sub == nil {
		return "", false, fmt.Errorf("no seine_traffic_mode_info in the metrics of %s", node)
	}
	return sub[1], sub[2] == "true", nil
}

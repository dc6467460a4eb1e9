package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/netpol"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tunnel"
)

// Traffic modes. Each run of this package brings the shared sandbox up in
// one mode: $SEINE_E2E_MODE (default encap), over $SEINE_E2E_SUBNETS
// transport subnets (default 1 for encap, 2 for the other modes: Nodes 1
// and 2 in 198.18.0.0/24, Node 3 in 198.18.1.0/24). Tests that only mean
// something in some modes skip themselves in the others
// (requireMode). $SEINE_E2E_TABLES=smoke runs 6 of the 48 NetworkPolicy
// scenarios instead of all; tests/e2e/modes.sh (make test) decides which
// mode runs which tests.

var (
	e2eMode    config.TrafficEncapMode
	e2eSubnets int
	fullTables = true
)

// readModeEnv reads the run's mode, subnets and table size.
func readModeEnv() error {
	e2eMode = config.TrafficEncapMode(os.Getenv("SEINE_E2E_MODE"))
	if e2eMode == "" {
		e2eMode = config.ModeEncap
	}
	if !e2eMode.Valid() {
		return fmt.Errorf("SEINE_E2E_MODE=%q: want one of %v", e2eMode, config.Modes())
	}
	e2eSubnets = 2
	if e2eMode == config.ModeEncap {
		e2eSubnets = 1
	}
	if v := os.Getenv("SEINE_E2E_SUBNETS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("SEINE_E2E_SUBNETS=%q: %w", v, err)
		}
		e2eSubnets = n
	}
	switch os.Getenv("SEINE_E2E_TABLES") {
	case "", "full":
	case "smoke":
		fullTables = false
	default:
		return fmt.Errorf("SEINE_E2E_TABLES=%q: want full or smoke", os.Getenv("SEINE_E2E_TABLES"))
	}
	return nil
}

// sandboxTunnel is the tunnel type the sandbox's Nodes choose: their
// configuration leaves tunnelType empty, so a fresh cluster on the
// userspace datapath gets tunnel.DefaultType.
var sandboxTunnel = tunnel.DefaultType(true)

// tunnelUDPPort is the IANA destination port of a UDP tunnel type
// (RFC 7348 section 5, RFC 8926 section 3.3), "" for GRE.
func tunnelUDPPort(typ string) string {
	return map[string]string{tunnel.VXLAN: "4789", tunnel.Geneve: "6081"}[typ]
}

// requireMode skips the test unless the shared sandbox runs in one of
// modes.
func requireMode(t *testing.T, modes ...config.TrafficEncapMode) {
	t.Helper()
	for _, m := range modes {
		if e2eMode == m {
			return
		}
	}
	t.Skipf("traffic mode %s (this test needs %v)", e2eMode, modes)
}

// smokeScenarios are the NetworkPolicy scenarios a smoke run keeps: default
// deny both ways, a namespace and Pod selector, ports, and one each of UDP
// and SCTP.
var smokeScenarios = map[string]bool{
	"TCP/should support a 'default-deny-ingress' policy": true,
	"TCP/should support a 'default-deny-all' policy":     true,
	"TCP/should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector": true,
	"TCP/should enforce multiple egress policies with egress allow-all policy taking precedence":                                     true,
	"UDP/should enforce policy based on Ports":  true,
	"SCTP/should enforce policy based on Ports": true,
}

// inTables reports whether a NetworkPolicy scenario runs in this run.
func inTables(sc netpol.Scenario) bool { return fullTables || smokeScenarios[sc.Group+"/"+sc.Name] }

// expectedSource is the address the external host should see for a Pod's
// connection: the Node IP when the Node's seine masquerades, else the Pod
// IP (noSNAT, or networkPolicyOnly, where the sandbox's primary CNI does
// not masquerade and the underlay routes Pod addresses).
func expectedSource(t *testing.T, c *sandbox.Cluster, p podRef) string {
	t.Helper()
	_, snat, err := c.DaemonMode(testCtx(t, 10*time.Second), p.node)
	if err != nil {
		t.Fatal(err)
	}
	if snat {
		n, err := c.Node(p.node)
		if err != nil {
			t.Fatal(err)
		}
		return n.IP
	}
	return p.ip
}

// TestModeReported: every Node's daemon runs in the sandbox's mode and says
// so in its metrics (seine_traffic_mode_info, what seinectl and `sandbox
// status` read), with its peers counted by route as the mode and subnets
// imply.
func TestModeReported(t *testing.T) {
	c := shared
	ctx := testCtx(t, 30*time.Second)
	for _, n := range c.Nodes() {
		mode, _, err := c.DaemonMode(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if mode != string(e2eMode) {
			t.Errorf("%s reports mode %q, want %s", n.Name, mode, e2eMode)
		}
		m, err := c.NodeMetrics(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{}
		for _, p := range c.Nodes() {
			if p.Name == n.Name {
				continue
			}
			same := p.Subnet == n.Subnet
			switch {
			case e2eMode == config.ModeEncap, e2eMode == config.ModeHybrid && !same:
				want["tunnel"]++
			case e2eMode == config.ModeNetworkPolicyOnly:
				// No peers: connectivity is the primary CNI's.
			case same:
				want["direct"]++
			default:
				want["underlay"]++
			}
		}
		// The e2e run gives hybrid the NAT checksum detour (main_test.go).
		natMode := map[bool]string{true: config.NATChecksumDetour, false: config.NATChecksumRewrite}[e2eMode == config.ModeHybrid]
		if line := fmt.Sprintf(`seine_nat_checksum_info{mode=%q} 1`, natMode); !strings.Contains(m, line) {
			t.Errorf("%s: no %q in its metrics:\n%s", n.Name, line, grepLines(m, "seine_nat_checksum_info"))
		}
		// With the rewrite, every hook has its filter (the gauge starts
		// at 0, and the keeper's checks keep it there); with the detour,
		// the keeper does not run and the gauge does not exist.
		hooksMissing := strings.Contains(m, "seine_nat_checksum_hooks_missing ")
		if natMode == config.NATChecksumRewrite && !strings.Contains(m, "seine_nat_checksum_hooks_missing 0\n") ||
			natMode == config.NATChecksumDetour && hooksMissing {
			t.Errorf("%s (%s): seine_nat_checksum_hooks_missing: %q", n.Name, natMode, grepLines(m, "seine_nat_checksum_hooks_missing"))
		}
		// The segmentation port is on the bridge only where packets pass
		// through it: the detour's NATed packets, or an OVS tunnel port's
		// (not VXLAN's kernel device). Idle, it would still be read in
		// every turn of ovs-vswitchd's loop. (The sandbox tunnels by VXLAN's
		// kernel device; the second term holds the rule for another
		// default.)
		wantSeg := natMode == config.NATChecksumDetour || sandboxTunnel != tunnel.VXLAN && e2eMode.UsesTunnel()
		if ports := ovs(t, n, "ovs-vsctl", "list-ports", "br-int"); strings.Contains(ports, "seine-seg0") != wantSeg {
			t.Errorf("%s (%s, %s): seine-seg0 on br-int %v, want %v; ports:\n%s", n.Name, natMode, sandboxTunnel,
				!wantSeg, wantSeg, ports)
		}
		for _, r := range []string{"tunnel", "direct", "underlay"} {
			line := fmt.Sprintf(`seine_peer_node_routes{route=%q} %d`, r, want[r])
			if !strings.Contains(m, line) {
				t.Errorf("%s: no %q in its metrics:\n%s", n.Name, line, grepLines(m, "seine_peer_node_routes"))
			}
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAllPodPairs: two Pods on every Node; every ordered pair connects
// over TCP and UDP, answered by the right Pod, and sees the client's Pod
// IP as the source (nothing masquerades Pod-to-Pod traffic).
func TestAllPodPairs(t *testing.T) {
	c := shared
	var nodes []int
	for i := range c.Nodes() {
		nodes = append(nodes, i, i)
	}
	pods := createPods(t, c, "pairs", nodes...)
	for _, from := range pods {
		for _, to := range pods {
			if from.name == to.name {
				continue
			}
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
				port := tcpPort
				if proto == corev1.ProtocolUDP {
					port = udpPort
				}
				r := probe(t, c, from, to.ip, port, proto)
				what := fmt.Sprintf("%s (%s) to %s (%s) over %s", from.name, from.node, to.name, to.node, proto)
				expectConnected(t, r, to.name, what)
				if host, _, _ := net.SplitHostPort(r.Client); r.Outcome == sandbox.Connected && host != from.ip {
					t.Errorf("%s: the server saw %s, want the client's Pod IP %s", what, host, from.ip)
				}
			}
		}
	}
}

package bench

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tunnel"
)

// spRounds is how many rounds BenchmarkIdleSegmentPort takes.
const spRounds = 8

// BenchmarkIdleSegmentPort prices the segmentation port where nothing
// passes through it, as every Node with the userspace datapath and
// userspace TSO had it until 2026-11-27 also in the default configuration
// (a kernel VXLAN device, natChecksum rewrite), which now goes without
// (segmentPortNeeded in node/agent). ovs-vswitchd reads every non-PMD port
// in each turn of its main loop, idle or not.
//
// On a 2-Node sandbox in its default configuration it checks that neither
// Node has the port, then takes turns for spRounds rounds, the order
// alternating: the Nodes as they are ("without"), and with the pair an
// earlier release made added back on both Nodes ("with": seine-seg0 as
// ofport 65001 without transmit offloads, its peer up and off the bridge,
// IPv6 off on both; the peer's hairpin filter is left out, as no packet
// reaches it). Each turn measures
// Pod-to-Pod on one Node and across Nodes: one tcprr run (request/response
// latency) and one iperf3 stream each. Each turn checks the ports the
// Nodes' ovs-vswitchd poll (polledPorts): one more with the pair.
// Metrics: medians per state and path (<path>-<state>-p50-us, -Gbps) and
// the ratios <path>-without/with-{p50,Gbps}.
func BenchmarkIdleSegmentPort(b *testing.B) {
	rr := buildTCPRR(b)
	for range b.N {
		c, _, ends := perfSandbox(b, "bsp")
		nodes := c.Nodes()
		seg := tunnel.DefaultSegmentPair
		polled := make([]int, len(nodes))
		for i, n := range nodes {
			if ports := vsctl(b, n, "list-ports", "br-int"); strings.Contains(ports, seg.Port) {
				b.Fatalf("%s: %s is on br-int in the default configuration, where nothing passes through it:\n%s", n.Name, seg.Port, ports)
			}
			polled[i] = polledPorts(b, n)
		}
		b.Cleanup(func() {
			for _, n := range nodes {
				delLink(n.NetNS, seg.Port)
			}
		})
		segOn := false
		setSeg := func(on bool) {
			if on == segOn {
				return // rounds alternate the order: a state may run twice in a row
			}
			segOn = on
			for i, n := range nodes {
				if on {
					sh(b, "ip", "-n", n.NetNS, "link", "add", seg.Port, "type", "veth", "peer", "name", seg.Hairpin)
					sh(b, "ip", "netns", "exec", n.NetNS, "ethtool", "-K", seg.Port, "tx", "off", "tso", "off", "gso", "off")
					for _, end := range []string{seg.Port, seg.Hairpin} { // as SegmentPair.Ensure: no IPv6 chatter
						sh(b, "ip", "netns", "exec", n.NetNS, "sysctl", "-qw", "net.ipv6.conf."+end+".disable_ipv6=1")
					}
					sh(b, "ip", "-n", n.NetNS, "link", "set", seg.Hairpin, "up")
					sh(b, "ip", "-n", n.NetNS, "link", "set", seg.Port, "up")
					vsctl(b, n, "add-port", "br-int", seg.Port, "--", "set", "Interface", seg.Port, "ofport_request=65001")
				} else {
					vsctl(b, n, "--if-exists", "del-port", "br-int", seg.Port)
					delLink(n.NetNS, seg.Port)
				}
				want := polled[i]
				if on {
					want++
				}
				if got := polledPorts(b, n); got != want {
					b.Fatalf("%s with the segmentation port %v: ovs-vswitchd polls %d ports, want %d", n.Name, on, got, want)
				}
			}
			time.Sleep(time.Second) // ovs-vswitchd has reconfigured
		}

		takeTurns(b, rr, ends, spRounds, []string{"without", "with"}, "with", func(s string) { setSeg(s == "with") }, nil)
		setSeg(false)
		b.Logf("ports polled without the segmentation port: %v (%s and %s)", polled, nodes[0].Name, nodes[1].Name)
	}
}

// vsctl runs ovs-vsctl against Node n's OVSDB and fails the benchmark on
// error.
func vsctl(b *testing.B, n sandbox.Node, args ...string) string {
	b.Helper()
	return sh(b, append([]string{"ovs-vsctl", "--db=unix:" + filepath.Join(n.OVSRunDir, "db.sock"), "--timeout=10"}, args...)...)
}

// delLink deletes a device of network namespace ns, if it is there.
func delLink(ns, name string) {
	_ = exec.Command("ip", "-n", ns, "link", "del", name).Run()
}

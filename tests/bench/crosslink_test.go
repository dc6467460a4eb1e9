package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seine-net/seine/tests/bench/stats"
	"github.com/seine-net/seine/tests/sandbox"
)

// xlRounds is how many rounds BenchmarkCrossNodeLink takes; each round
// measures every path once, in an order that rotates between rounds.
const xlRounds = 7

// xlStrayBytes is what the direct link may receive during an underlay
// turn (ARP and the like), in bytes.
const xlStrayBytes = 1 << 20

// BenchmarkCrossNodeLink compares Pod-to-Pod traffic across Nodes with the
// fastest bare two-bridge topology (twoBridgesPath, its Nodes joined by one
// veth pair) on the same wire. BenchmarkDataplane measures Seine across
// the sandbox's underlay, where every frame between Nodes crosses one more
// veth and a Linux bridge in the underlay's namespace; that hop alone costs
// the bare pair about a third of its throughput on this 2-core machine, so
// Seine on it cannot be read against the bare pair on one veth. Here the
// two sandbox Nodes get a second link, one veth pair between their
// namespaces wired like the bare pair's (no transmit offloads, GRO on), and
// a host route to the peer's InternalIP through it: the tunnel traffic
// (VXLAN, the default on the userspace datapath) takes the same wire as
// the bare pair's, while the control plane keeps the underlay.
//
// Paths, taking turns for xlRounds rounds, each round one iperf3 run of
// one stream and of dpStreams streams and one tcprr run per path:
// bare2-vxlan (the bare pair, up beside the sandbox all along),
// seine-cross-direct (the direct link) and seine-cross-underlay (the
// route removed: the sandbox's underlay). Each Seine turn checks the
// wire it took: a direct turn must bring the direct link at least the
// bytes iperf3 received in its one-stream run, an underlay turn less than
// xlStrayBytes. Metrics: medians per path, the ratios
// cross-direct/bare2-{Gbps,Gbps-P<dpStreams>,p50} and
// cross-underlay/bare2-Gbps.
func BenchmarkCrossNodeLink(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	rr := buildTCPRR(b)
	for i := 0; i < b.N; i++ {
		c := up(b, "bxl", 2, nil)
		nodes := c.Nodes()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		b.Cleanup(cancel)
		srvNS, srvIP := perfPod(ctx, b, c, "server", nodes[0].Name, "server")
		cliNS, _ := perfPod(ctx, b, c, "remote", nodes[1].Name, "client")
		waitReachable(ctx, b, c, cliNS, srvIP)
		link := directLink(b, nodes[0], nodes[1])
		bc, bs, bdst, down := twoBridgesUp(b, false)

		type path struct {
			name                string
			server, client, dst string
			direct              bool
			runs                turns
			many                []float64
		}
		paths := []*path{
			{name: "bare2-vxlan", server: bs, client: bc, dst: bdst},
			{name: "seine-cross-direct", server: srvNS, client: cliNS, dst: srvIP, direct: true},
			{name: "seine-cross-underlay", server: srvNS, client: cliNS, dst: srvIP},
		}
		for r := range xlRounds {
			for k := range paths {
				p := paths[(r+k)%len(paths)]
				seine := p.server == srvNS
				var before uint64
				if seine {
					link.route(b, p.direct)
					waitReachable(ctx, b, c, cliNS, srvIP)
					before = link.rxBytes(b)
				}
				gbps, received := iperf3Transfer(b, p.server, p.client, p.dst, 1)
				p.runs.Gbps = append(p.runs.Gbps, gbps)
				p.many = append(p.many, iperf3Run(b, p.server, p.client, p.dst, dpStreams))
				p50, _ := tcprrRun(b, rr, p.server, p.client, p.dst)
				p.runs.P50 = append(p.runs.P50, p50)
				if !seine {
					continue
				}
				// The wire this turn took, from what the direct link
				// received (the server's end).
				got := link.rxBytes(b) - before
				if p.direct && float64(got) < received {
					b.Fatalf("round %d, %s: the direct link received %d bytes, iperf3 %.0f: the tunnel traffic did not take it", r, p.name, got, received)
				}
				if !p.direct && got >= xlStrayBytes {
					b.Fatalf("round %d, %s: the direct link received %d bytes: the traffic did not take the underlay", r, p.name, got)
				}
			}
		}
		down()
		link.remove(b)
		cancel()

		for _, p := range paths {
			b.ReportMetric(stats.Median(p.runs.Gbps), p.name+"-Gbps")
			b.ReportMetric(stats.Median(p.many), p.name+"-Gbps-P"+strconv.Itoa(dpStreams))
			b.ReportMetric(stats.Median(p.runs.P50), p.name+"-p50-us")
			b.Logf("%-22s Gbit/s %v, %d streams %v, p50 µs %v", p.name, p.runs.Gbps, dpStreams, p.many, p.runs.P50)
		}
		bare, direct, under := paths[0], paths[1], paths[2]
		b.ReportMetric(stats.Median(direct.runs.Gbps)/stats.Median(bare.runs.Gbps), "cross-direct/bare2-Gbps")
		b.ReportMetric(stats.Median(direct.many)/stats.Median(bare.many), "cross-direct/bare2-Gbps-P"+strconv.Itoa(dpStreams))
		b.ReportMetric(stats.Median(direct.runs.P50)/stats.Median(bare.runs.P50), "cross-direct/bare2-p50")
		b.ReportMetric(stats.Median(under.runs.Gbps)/stats.Median(bare.runs.Gbps), "cross-underlay/bare2-Gbps")
	}
}

// nodeLink is a veth pair between two sandbox Nodes' namespaces ("eth1"
// on both), beside their underlay link.
type nodeLink struct {
	a, b sandbox.Node
}

// directLink joins two sandbox Nodes with one veth pair, both ends wired
// like the sandbox's host NICs and like twoBridgesPath's Nodes (transmit
// checksum and segmentation offload off, GRO on), with no route through it
// yet (route). remove deletes it; b.Cleanup does too.
func directLink(b *testing.B, x, y sandbox.Node) *nodeLink {
	b.Helper()
	l := &nodeLink{a: x, b: y}
	sh(b, "ip", "-n", x.NetNS, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns", y.NetNS)
	b.Cleanup(func() { _ = l.del() })
	for _, n := range []sandbox.Node{x, y} {
		sh(b, "ip", "netns", "exec", n.NetNS, "ethtool", "-K", "eth1", "tx", "off", "tso", "off", "gso", "off", "gro", "on")
		sh(b, "ip", "-n", n.NetNS, "link", "set", "eth1", "up")
	}
	return l
}

// route sends each Node's traffic to the other's InternalIP through the
// link (on) or leaves it to the underlay (off).
func (l *nodeLink) route(b *testing.B, on bool) {
	b.Helper()
	for _, e := range []struct{ from, to sandbox.Node }{{l.a, l.b}, {l.b, l.a}} {
		if on {
			sh(b, "ip", "-n", e.from.NetNS, "route", "replace", e.to.IP+"/32", "dev", "eth1", "src", e.from.IP)
		} else {
			// Absent already in the first round ("No such process").
			out, err := exec.Command("ip", "-n", e.from.NetNS, "route", "del", e.to.IP+"/32", "dev", "eth1").CombinedOutput()
			if err != nil && !strings.Contains(string(out), "No such process") {
				b.Fatalf("removing the route to %s through the direct link: %v: %s", e.to.IP, err, out)
			}
		}
	}
}

// rxBytes is what the link's end on the first Node received, in bytes.
func (l *nodeLink) rxBytes(b *testing.B) uint64 {
	b.Helper()
	var n uint64
	out := sh(b, "ip", "netns", "exec", l.a.NetNS, "cat", "/sys/class/net/eth1/statistics/rx_bytes")
	if _, err := fmt.Sscan(out, &n); err != nil {
		b.Fatalf("rx_bytes of eth1: %v", err)
	}
	return n
}

func (l *nodeLink) remove(b *testing.B) {
	b.Helper()
	if err := l.del(); err != nil {
		b.Error(err)
	}
}

// del deletes the pair from its first end.
func (l *nodeLink) del() error {
	if out, err := exec.Command("ip", "-n", l.a.NetNS, "link", "del", "eth1").CombinedOutput(); err != nil {
		return fmt.Errorf("deleting the direct link: %w: %s", err, out)
	}
	return nil
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/seine-net/seine/node/config"
	"github.com/seine-net/seine/tests/sandbox"
	"github.com/seine-net/seine/tunnel"
)

// dataplaneState lists what a Node's datapath consists of, one sorted line
// per item, with what changes on every restart (flow cookies, whose top
// bits count rounds; learned flows; counters) left out: OVS bridges and
// ports, flows, IPv4 addresses and routes, and nftables rules.
func dataplaneState(t *testing.T, c *sandbox.Cluster, n sandbox.Node) string {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	var lines []string
	add := func(kind string, out string) {
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, kind+": "+l)
			}
		}
	}
	brs := ovs(t, n, "ovs-vsctl", "list-br")
	add("bridge", brs)
	for _, br := range strings.Fields(brs) {
		add("port "+br, ovs(t, n, "ovs-vsctl", "list-ports", br))
	}
	cookie := regexp.MustCompile(`cookie=0x[0-9a-f]+, `)
	for _, f := range strings.Split(ovs(t, n, "ovs-ofctl", "--no-stats", "--names", "dump-flows", brInt(n)), "\n") {
		if strings.Contains(f, "hard_timeout") { // learned session affinity
			continue
		}
		add("flow", cookie.ReplaceAllString(f, ""))
	}
	for kind, argv := range map[string][]string{
		"addr":  {"ip", "-4", "-o", "addr", "show"},
		"route": {"ip", "-4", "route", "show", "table", "main"},
		"rule":  {"ip", "-4", "rule", "show"},
		"nft":   {"nft", "list", "ruleset"},
	} {
		out, err := c.NodeExec(ctx, n.Name, argv...)
		if err != nil {
			t.Fatalf("%v on %s: %v: %s", argv, n.Name, err, out)
		}
		s := string(out)
		if kind == "addr" {
			// Interface indexes change when br-phy is made again.
			s = regexp.MustCompile(`(?m)^\d+:\s+|valid_lft.*`).ReplaceAllString(s, "")
		}
		add(kind, s)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// diffLines reports the lines only in a and only in b.
func diffLines(a, b string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l, n := range ma {
		if mb[l] < n {
			out = append(out, "- "+l)
		}
	}
	for l, n := range mb {
		if ma[l] < n {
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestModeChangeConverges restarts every Node of the (encap) shared
// sandbox in hybrid, noEncap, networkPolicyOnly and encap again, checking
// after each change that what the old mode had and the new one has not is
// gone (tunnel port, transport bridge and its nftables table, peer routes,
// gateway address, SNAT table) and that Pods still talk (not in
// networkPolicyOnly: this sandbox's Pods were given their addresses by
// seine, not by a primary CNI); and finally that every Node's OVS ports,
// flows, addresses, routes and nftables rules are what they were before.
func TestModeChangeConverges(t *testing.T) {
	requireMode(t, config.ModeEncap)
	c := shared
	nodes := c.Nodes()
	pods := createPods(t, c, "modechange", 0, 1, 2)
	before := map[string]string{}
	for _, n := range nodes {
		before[n.Name] = dataplaneState(t, c, n)
	}
	switchTo := func(mode config.TrafficEncapMode) {
		t.Helper()
		set := map[string]string{"trafficEncapMode": string(mode)}
		for _, n := range nodes {
			if mode == config.ModeNetworkPolicyOnly {
				// A primary conflist outside the kubelet's directory:
				// this sandbox's Pods keep using seine's own.
				p := filepath.Join(n.Dir, "modechange-primary.conflist")
				b, err := sandbox.PrimaryConflist(nodePodCIDR(t, c, n.Name), n)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, b, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Remove(p) })
				set["primaryCNIConflist"] = p
			}
			stopSeine(t, c, n.Name)
			if err := c.StartSeine(testCtx(t, time.Minute), n.Name, set); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range nodes {
			if got, _, err := c.DaemonMode(testCtx(t, 10*time.Second), n.Name); err != nil || got != string(mode) {
				t.Fatalf("%s runs %q (%v), want %s", n.Name, got, err, mode)
			}
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				_ = c.StopSeine(n.Name)
				_ = c.StartSeine(context.Background(), n.Name, nil)
			}
		}
	})
	talk := func(mode config.TrafficEncapMode) {
		t.Helper()
		for i, from := range pods {
			to := pods[(i+1)%len(pods)]
			eventually(t, 20*time.Second, fmt.Sprintf("%s: %s to %s", mode, from.node, to.node), func() error {
				if r := probe(t, c, from, to.ip, tcpPort, corev1.ProtocolTCP); r.Outcome != sandbox.Connected || r.Reply != to.name {
					return fmt.Errorf("got %s", r)
				}
				return nil
			})
		}
	}
	nodeOut := func(n sandbox.Node, argv ...string) string {
		t.Helper()
		out, err := c.NodeExec(testCtx(t, 10*time.Second), n.Name, argv...)
		if err != nil {
			t.Fatalf("%v on %s: %v: %s", argv, n.Name, err, out)
		}
		return string(out)
	}
	peerRoutes := func(n sandbox.Node) string { return nodeOut(n, "ip", "-4", "route", "show", "proto", "95") }
	hasTransportBridge := func(n sandbox.Node) bool { return strings.Contains(ovs(t, n, "ovs-vsctl", "list-br"), "br-phy") }
	hasTunnel := func(n sandbox.Node) bool {
		return strings.Contains(ovs(t, n, "ovs-vsctl", "list-ports", "br-int"), "seine-tun0")
	}
	hasNFT := func(n sandbox.Node, table string) bool {
		return strings.Contains(nodeOut(n, "nft", "list", "tables"), table)
	}

	// With the userspace datapath only Geneve and GRE take the transport
	// interface into br-phy (tunnel.Choose); VXLAN leaves it the kernel's.
	transport, bridged := "eth0", tunnel.Choose(true, sandboxTunnel) == tunnel.KindOVSPort
	if bridged {
		transport = "br-phy"
	}
	switchTo(config.ModeHybrid)
	for _, n := range nodes {
		if !hasTunnel(n) || hasTransportBridge(n) != bridged {
			t.Errorf("hybrid: %s lacks the tunnel port, or has br-phy %v with %s", n.Name, hasTransportBridge(n), sandboxTunnel)
		}
		// One subnet: every peer is routed directly through the transport.
		if r := peerRoutes(n); strings.Count(r, " dev "+transport+" ") != 2 || strings.Contains(r, "seine-gw0") {
			t.Errorf("hybrid: routes of %s:\n%s", n.Name, r)
		}
	}
	talk(config.ModeHybrid)

	switchTo(config.ModeNoEncap)
	for _, n := range nodes {
		if hasTunnel(n) || hasTransportBridge(n) || hasNFT(n, "netdev seine-transport") {
			t.Errorf("noEncap: %s kept the tunnel port, br-phy or its nftables table", n.Name)
		}
		if addr := nodeOut(n, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(addr, n.IP+"/") {
			t.Errorf("noEncap: the Node IP is not back on eth0 of %s: %s", n.Name, addr)
		}
		if r := peerRoutes(n); strings.Count(r, " dev eth0 ") != 2 || strings.Contains(r, "seine-gw0") {
			t.Errorf("noEncap: routes of %s:\n%s", n.Name, r)
		}
		if r := nodeOut(n, "ip", "-4", "route", "show", "default"); !strings.Contains(r, "dev eth0") {
			t.Errorf("noEncap: default route of %s not back on eth0: %s", n.Name, r)
		}
	}
	talk(config.ModeNoEncap)

	switchTo(config.ModeNetworkPolicyOnly)
	for _, n := range nodes {
		if hasTunnel(n) || hasTransportBridge(n) {
			t.Errorf("networkPolicyOnly: %s has the tunnel port or br-phy", n.Name)
		}
		if r := peerRoutes(n); strings.TrimSpace(r) != "" {
			t.Errorf("networkPolicyOnly: peer routes left on %s:\n%s", n.Name, r)
		}
		if a := nodeOut(n, "ip", "-4", "addr", "show", "dev", "seine-gw0"); strings.Contains(a, "inet ") {
			t.Errorf("networkPolicyOnly: seine-gw0 of %s kept an address:\n%s", n.Name, a)
		}
		if hasNFT(n, "table ip seine\n") {
			t.Errorf("networkPolicyOnly: %s kept the SNAT table", n.Name)
		}
	}

	switchTo(config.ModeEncap)
	talk(config.ModeEncap)
	for _, n := range nodes {
		// The peers' routes and the proxy's state settle within moments of
		// the CNI socket appearing.
		after := dataplaneState(t, c, n)
		for deadline := time.Now().Add(20 * time.Second); after != before[n.Name] && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
			after = dataplaneState(t, c, n)
		}
		if d := diffLines(before[n.Name], after); d != "" {
			t.Errorf("%s after encap → hybrid → noEncap → networkPolicyOnly → encap:\n%s", n.Name, d)
		}
	}
}

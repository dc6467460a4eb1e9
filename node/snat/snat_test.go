package snat

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/tests/netnstest"
)

func TestSyncProgramsMasqueradeAndNodeSet(t *testing.T) {
	netnstest.Run(t, func() {
		nft, err := NewNFTables()
		if err != nil {
			t.Fatal(err)
		}
		_, cidr, _ := net.ParseCIDR("10.244.0.0/16")
		m := New(nft, cidr, "seine-gw0", true)
		m.SetNodeIP("n1", net.ParseIP("198.18.0.11"))
		m.SetNodeIP("n2", net.ParseIP("198.18.0.12"))
		ctx := context.Background()
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("nft", "list", "table", "ip", "seine").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		s := string(out)
		for _, want := range []string{"198.18.0.11", "198.18.0.12", "masquerade", `oifname != "seine-gw0"`, "ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16"} {
			if !strings.Contains(s, want) {
				t.Errorf("ruleset lacks %q:\n%s", want, s)
			}
		}
		// Every Node recorded: from now on a forgotten IP leaves the set.
		if err := m.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		m.SetNodeIP("n2", nil)
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		out, _ = exec.Command("nft", "list", "table", "ip", "seine").CombinedOutput()
		if strings.Contains(string(out), "198.18.0.12") || strings.Count(string(out), "masquerade") != 1 {
			t.Errorf("after removing n2 and resync:\n%s", out)
		}
		if err := m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nft", "list", "table", "ip", "seine").CombinedOutput(); err == nil {
			t.Errorf("table still present after Cleanup:\n%s", out)
		}
	})
}

// countingNFT is knftables' fake that counts transactions and fails the
// next one when fail is set.
type countingNFT struct {
	*knftables.Fake
	runs int
	fail error
}

func (c *countingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	c.runs++
	if err := c.fail; err != nil {
		c.fail = nil
		return err
	}
	return c.Fake.Run(ctx, tx)
}

// TestSyncSkipsUnchanged: a Sync that would write what the last successful
// one wrote starts no transaction; after a failed Sync, or Cleanup, the
// next one writes again.
func TestSyncSkipsUnchanged(t *testing.T) {
	nft := &countingNFT{Fake: knftables.NewFake(knftables.IPv4Family, TableName)}
	_, cidr, _ := net.ParseCIDR("10.244.0.0/16")
	m := New(nft, cidr, "seine-gw0", true)
	ctx := context.Background()
	sync := func(what string, wantRuns int, wantIPs ...string) {
		t.Helper()
		if err := m.Sync(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if nft.runs != wantRuns {
			t.Errorf("%s: %d transactions in all, want %d", what, nft.runs, wantRuns)
		}
		set := nft.Table.Sets[setNodeIPs]
		if set == nil {
			t.Fatalf("%s: no set %s", what, setNodeIPs)
		}
		var got []string
		for _, e := range set.Elements {
			got = append(got, e.Key[0])
		}
		if !slices.Equal(got, wantIPs) {
			t.Errorf("%s: set %v, want %v", what, got, wantIPs)
		}
	}
	m.SetNodeIP("n1", net.ParseIP("198.18.0.11"))
	m.SetNodeIP("n2", net.ParseIP("198.18.0.12"))
	sync("first", 1, "198.18.0.11", "198.18.0.12")
	sync("unchanged", 1, "198.18.0.11", "198.18.0.12")
	m.SetNodeIP("n2", net.ParseIP("198.18.0.12"))
	m.SetNodeIP("n2b", net.ParseIP("198.18.0.12")) // the same IP again
	sync("the same IPs recorded again", 1, "198.18.0.11", "198.18.0.12")
	m.SetNodeIP("n3", net.ParseIP("198.18.0.13"))
	sync("n3 added", 2, "198.18.0.11", "198.18.0.12", "198.18.0.13")

	m.SetNodeIP("n3", nil)
	nft.fail = errors.New("injected failure")
	if err := m.Sync(ctx); err == nil {
		t.Fatal("Sync with a failing transaction succeeded")
	}
	m.SetNodeIP("n3", net.ParseIP("198.18.0.13")) // back to what was last written
	sync("after a failed Sync", 4, "198.18.0.11", "198.18.0.12", "198.18.0.13")

	if err := m.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	sync("after Cleanup", 6, "198.18.0.11", "198.18.0.12", "198.18.0.13")

	// Prune changes what a transaction writes (the set is flushed
	// first): one transaction, then none again.
	for range 2 {
		if err := m.Prune(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sync("after Prune", 7, "198.18.0.11", "198.18.0.12", "198.18.0.13")

	// An unchanged table is written again once rewriteAfter has passed:
	// one that something else removed comes back.
	later := time.Now().Add(rewriteAfter + time.Second)
	m.now = func() time.Time { return later }
	sync("unchanged, rewriteAfter later", 8, "198.18.0.11", "198.18.0.12", "198.18.0.13")
	sync("unchanged again", 8, "198.18.0.11", "198.18.0.12", "198.18.0.13")
}

// nodeIPs lists the elements of the real node-ips set.
func nodeIPs(t *testing.T, ctx context.Context, nft knftables.Interface) []string {
	t.Helper()
	elems, err := nft.ListElements(ctx, "set", setNodeIPs)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range elems {
		out = append(out, e.Key[0])
	}
	slices.Sort(out)
	return out
}

// TestRestartKeepsNodeIPsUntilPrune: a restarted daemon's Masquerade,
// which records its own Node first and the others as the route controller
// syncs them, keeps the previous run's Node IPs in the set (Pod traffic
// to those Nodes is not masqueraded meanwhile) until Prune; then the set
// holds the recorded IPs only, and forgetting one removes it.
func TestRestartKeepsNodeIPsUntilPrune(t *testing.T) {
	netnstest.Run(t, func() {
		ctx := context.Background()
		_, cidr, _ := net.ParseCIDR("10.244.0.0/16")
		start := func() (*Masquerade, knftables.Interface) {
			t.Helper()
			nft, err := NewNFTables()
			if err != nil {
				t.Fatal(err)
			}
			return New(nft, cidr, "seine-gw0", true), nft
		}
		check := func(what string, nft knftables.Interface, want ...string) {
			t.Helper()
			if got := nodeIPs(t, ctx, nft); !slices.Equal(got, want) {
				t.Errorf("%s: node-ips %v, want %v", what, got, want)
			}
		}
		m, nft := start()
		m.SetNodeIP("n1", net.ParseIP("198.18.0.11"))
		m.SetNodeIP("n2", net.ParseIP("198.18.0.12"))
		m.SetNodeIP("n3", net.ParseIP("198.18.0.13"))
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		check("first run", nft, "198.18.0.11", "198.18.0.12", "198.18.0.13")

		// Restart of n1's daemon; n3 was deleted while it was down.
		m, nft = start()
		m.SetNodeIP("n1", net.ParseIP("198.18.0.11"))
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		check("restarted, own Node recorded", nft, "198.18.0.11", "198.18.0.12", "198.18.0.13")
		m.SetNodeIP("n2", net.ParseIP("198.18.0.12"))
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		check("every Node recorded, pruned", nft, "198.18.0.11", "198.18.0.12")
		m.SetNodeIP("n2", nil)
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		check("n2 forgotten", nft, "198.18.0.11")
		if out, err := exec.Command("nft", "list", "table", "ip", "seine").CombinedOutput(); err != nil ||
			strings.Count(string(out), "masquerade") != 1 {
			t.Errorf("want one masquerade rule: %v\n%s", err, out)
		}
	})
}

package snat

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"

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

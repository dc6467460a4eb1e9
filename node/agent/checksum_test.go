package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/seine-net/seine/datapath/csumseed"
	"github.com/seine-net/seine/tests/netnstest"
)

// TestSeedKeeper checks that the keeper attaches the checksum seed program
// where a hook lacks it (a device made later, a filter removed), counts
// the hooks it cannot mend in seine_nat_checksum_hooks_missing, and logs a
// hook it cannot mend once, not on every check.
func TestSeedKeeper(t *testing.T) {
	netnstest.Run(t, func() {
		veth := func(name, peer string) {
			t.Helper()
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
				t.Fatal(err)
			}
		}
		veth("sk-a", "sk-b")
		prog, err := csumseed.Load()
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()

		core, logs := observer.New(zapcore.WarnLevel)
		reg := prometheus.NewRegistry()
		hooks := []seedHook{{"sk-a", csumseed.Egress}, {"sk-x", csumseed.Egress}} // sk-x comes later
		k := newSeedKeeper(prog, hooks, reg, zap.New(core))
		attached := func(device string) bool {
			t.Helper()
			ok, err := csumseed.Attached(device, csumseed.Egress)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}

		for range 2 {
			if n := k.ensure(); n != 1 {
				t.Fatalf("ensure with sk-x missing: %d hooks missing, want 1", n)
			}
		}
		if !attached("sk-a") {
			t.Fatal("sk-a has no filter after ensure")
		}
		if got := testutil.ToFloat64(k.missing); got != 1 {
			t.Fatalf("seine_nat_checksum_hooks_missing = %v, want 1", got)
		}
		if n := logs.FilterMessageSnippet("cannot be attached").FilterField(zap.String("interface", "sk-x")).Len(); n != 1 {
			t.Fatalf("the unmendable hook was logged %d times over two checks, want once", n)
		}
		if n := logs.FilterMessageSnippet("attached again").Len(); n != 1 {
			t.Fatalf("%d 'attached again' lines, want 1 (sk-a at the first check)", n)
		}

		// The device appears, and sk-a's filter is removed: both mended.
		veth("sk-x", "sk-y")
		if err := csumseed.Detach("sk-a", csumseed.Egress); err != nil {
			t.Fatal(err)
		}
		if n := k.ensure(); n != 0 {
			t.Fatalf("ensure after sk-x appeared: %d hooks missing, want 0", n)
		}
		for _, d := range []string{"sk-a", "sk-x"} {
			if !attached(d) {
				t.Fatalf("%s has no filter after ensure", d)
			}
		}
		if got := testutil.ToFloat64(k.missing); got != 0 {
			t.Fatalf("seine_nat_checksum_hooks_missing = %v, want 0", got)
		}
		if n := logs.FilterMessageSnippet("attached again").Len(); n != 3 {
			t.Fatalf("%d 'attached again' lines, want 3", n)
		}

		// Nothing to mend: nothing logged.
		before := logs.Len()
		if n := k.ensure(); n != 0 || logs.Len() != before {
			t.Fatalf("a check with every filter in place: %d missing, %d new log lines", n, logs.Len()-before)
		}

		// Closed, the keeper leaves the hooks alone (the reconnect hook
		// may still call it while the daemon stops); the filters stay.
		if err := k.close(); err != nil {
			t.Fatal(err)
		}
		if !attached("sk-x") {
			t.Fatal("close removed a filter")
		}
		if err := csumseed.Detach("sk-a", csumseed.Egress); err != nil {
			t.Fatal(err)
		}
		if n := k.ensure(); n != 0 || attached("sk-a") {
			t.Fatalf("ensure after close: %d missing, sk-a attached %v; want it to do nothing", n, attached("sk-a"))
		}
	})
}

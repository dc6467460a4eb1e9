package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/seine-net/seine/tests/netnstest"
)

// failingNFT is knftables' fake refusing every transaction while fail is
// set, as the kernel refuses one (a transient netlink error, a full
// ruleset).
type failingNFT struct {
	*knftables.Fake
	fail bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		return errors.New("refused")
	}
	return f.Fake.Run(ctx, tx)
}

// A failed update still counts what its caller now wants, and the next
// update of any frontend makes the table match: the element a refused
// transaction did not add is added, the one it did not remove is removed,
// even when the wants changed in between.
func TestHostUpdateRetriesWhatFailed(t *testing.T) {
	ctx := context.Background()
	nft := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, HostTable)}
	h := newHostWith(hostConfig{}, nft)
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	has := func(e element) bool {
		els, err := nft.ListElements(ctx, "set", e.set)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(els, func(el *knftables.Element) bool {
			return slices.Equal(canonicalKey(el.Key), canonicalKey(e.key))
		})
	}
	reject := rejectElement(net.IPv4(10, 96, 0, 10), 6, 80)
	np := nodePortElement(6, 30080)
	other := nodePortElement(17, 30053)

	nft.fail = true
	if err := h.update(ctx, []element{reject, np}, nil, nil, nil); err == nil {
		t.Fatal("the refused transaction did not fail the update")
	}
	if has(reject) || has(np) {
		t.Fatal("elements in the table after a refused transaction")
	}
	nft.fail = false
	// Another frontend's update (the first one's wants unchanged).
	if err := h.update(ctx, []element{other}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !has(reject) || !has(np) || !has(other) {
		t.Fatalf("after the next update: reject %v, NodePort %v, other %v; want all three", has(reject), has(np), has(other))
	}

	// A removal refused, then the frontend wants the element no more and
	// another changes: the element goes.
	nft.fail = true
	if err := h.update(ctx, nil, []element{reject}, nil, nil); err == nil {
		t.Fatal("the refused removal did not fail the update")
	}
	if !has(reject) {
		t.Fatal("element removed by a refused transaction")
	}
	// Another frontend's update while the table still refuses: its own
	// element is the error, not the one retried for the first frontend.
	third := nodePortElement(6, 30443)
	err := h.update(ctx, []element{third}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), third.id()) || strings.Contains(err.Error(), reject.id()) {
		t.Fatalf("an update while the table refuses: %v; want its own element named, not another's", err)
	}
	nft.fail = false
	if err := h.update(ctx, nil, []element{other, third}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if has(reject) || has(other) || !has(np) {
		t.Fatalf("after the next update: reject %v, other %v, NodePort %v; want the NodePort alone", has(reject), has(other), has(np))
	}
	if len(h.dirtyElements) != 0 {
		t.Errorf("dirty elements left: %v", h.dirtyElements)
	}
}

// Each external IP gets its own alias from the range, the same one for as
// long as a frontend holds it, also across a restart (read back from the
// map); an alias is free again once its map element has left the kernel;
// a range with none left says so.
func TestHostAliases(t *testing.T) {
	ctx := context.Background()
	nft := knftables.NewFake(knftables.IPv4Family, HostTable)
	_, aliases, _ := net.ParseCIDR("169.254.192.0/30") // two usable: .1 and .2
	cfg := hostConfig{aliases: aliases}
	h := newHostWith(cfg, nft)
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	x, y, z := net.ParseIP("198.18.100.10"), net.ParseIP("198.18.100.11"), net.ParseIP("198.18.100.12")
	ax, okx := h.aliasOf(x)
	ay, oky := h.aliasOf(y)
	if !okx || !oky || ax.Equal(ay) || !aliases.Contains(ax) || !aliases.Contains(ay) {
		t.Fatalf("aliases %v (%v) and %v (%v), want two distinct ones in %s", ax, okx, ay, oky, aliases)
	}
	for _, a := range []net.IP{ax, ay} {
		if a.Equal(net.ParseIP("169.254.192.0")) || a.Equal(net.ParseIP("169.254.192.3")) {
			t.Errorf("alias %s is the range's first or last address", a)
		}
	}
	if again, _ := h.aliasOf(x); !again.Equal(ax) {
		t.Errorf("second ask for %s: %s, want %s", x, again, ax)
	}
	if a, ok := h.aliasOf(z); ok {
		t.Errorf("alias %s from an exhausted range", a)
	}
	if err := h.update(ctx, []element{aliasElement(x, ax), aliasElement(y, ay)}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}

	// A restart: the new host takes the aliases back from the map.
	h = newHostWith(cfg, nft)
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	if a, _ := h.aliasOf(y); !a.Equal(ay) {
		t.Errorf("after a restart %s has alias %s, want %s", y, a, ay)
	}
	if a, _ := h.aliasOf(x); !a.Equal(ax) {
		t.Errorf("after a restart %s has alias %s, want %s", x, a, ax)
	}
	if err := h.update(ctx, []element{aliasElement(x, ax), aliasElement(y, ay)}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	// y's frontend goes: its alias leaves the map and, once the host's
	// conntrack entries NATed to it are gone, is z's to take.
	if err := h.update(ctx, nil, []element{aliasElement(y, ay)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	els, err := nft.ListElements(ctx, "map", MapLocalVIPAliases)
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 1 || els[0].Key[0] != x.String() || els[0].Value[0] != ax.String() {
		t.Errorf("map after y left: %v, want %s : %s alone", els, x, ax)
	}
	g := h.takeStaleConntrack()
	h.conntrackDeleted(g, nil)
	if a, ok := h.aliasOf(z); !ok || !a.Equal(ay) {
		t.Errorf("%s got alias %s (%v), want the freed %s", z, a, ok, ay)
	}
}

// recordCT is a connection tracker holding flows: DeleteMatching deletes
// those that match, as the kernel's would.
type recordCT struct {
	flows []*netlink.ConntrackFlow
	fail  bool // an interrupted dump
}

func (r *recordCT) DeleteMatching(match func(*netlink.ConntrackFlow) bool) (uint, error) {
	if r.fail {
		return 0, errors.New("dump interrupted")
	}
	n := len(r.flows)
	r.flows = slices.DeleteFunc(r.flows, match)
	return uint(n - len(r.flows)), nil
}

// ctFlow is a TCP or UDP flow from a client to dst:port whose reply comes
// from replySrc (dst itself when not NATed, its alias when the host
// DNATed it).
func ctFlow(dst string, proto uint8, port uint16, replySrc string) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET}
	f.Forward = netlink.IPTuple{SrcIP: net.ParseIP("198.18.0.100"), DstIP: net.ParseIP(dst), Protocol: proto, SrcPort: 40000, DstPort: port}
	f.Reverse = netlink.IPTuple{SrcIP: net.ParseIP(replySrc), DstIP: net.ParseIP("198.18.0.100"), Protocol: proto, SrcPort: port, DstPort: 40000}
	return f
}

// The host's conntrack entries NATed to an alias go with the alias (it may
// be another IP's next), and those of a port no longer served through an
// alias go with the port; the rest stay.
func TestHostDeletesConntrackOfGoneAliases(t *testing.T) {
	ctx := context.Background()
	nft := knftables.NewFake(knftables.IPv4Family, HostTable)
	_, aliases, _ := net.ParseCIDR("169.254.192.0/30") // two usable
	h := newHostWith(hostConfig{aliases: aliases}, nft)
	ct := &recordCT{}
	h.ct = ct
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	x, y := net.ParseIP("198.18.100.10"), net.ParseIP("198.18.100.11")
	ax, _ := h.aliasOf(x)
	ay, _ := h.aliasOf(y)
	xPorts := []element{aliasElement(x, ax), externalPortElement(x, 6, 80), externalPortElement(x, 17, 53)}
	if err := h.update(ctx, append(xPorts, aliasElement(y, ay), externalPortElement(y, 6, 80)), nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	keepX80 := ctFlow(x.String(), 6, 80, ax.String())
	goneX53 := ctFlow(x.String(), 17, 53, ax.String())
	localX53 := ctFlow(x.String(), 17, 53, x.String()) // delivered to the host, not NATed
	goneY := ctFlow(y.String(), 6, 80, ay.String())
	ct.flows = []*netlink.ConntrackFlow{keepX80, goneX53, localX53, goneY}
	// x's UDP port goes; y's frontend goes with its alias.
	if err := h.update(ctx, nil, []element{externalPortElement(x, 17, 53), aliasElement(y, ay), externalPortElement(y, 6, 80)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	// Until its entries are gone, y's alias goes to no one (the range
	// holds two: x's, and y's in quarantine).
	z := net.ParseIP("198.18.100.12")
	if a, ok := h.aliasOf(z); ok {
		t.Fatalf("alias %s handed out while the entries NATed to it remain", a)
	}
	// A failed pass keeps the work for the next one.
	ct.fail = true
	g := h.takeStaleConntrack()
	_, err := h.deleteConntrack(g)
	h.conntrackDeleted(g, err)
	if err == nil || len(ct.flows) != 4 || h.staleCT.empty() {
		t.Fatalf("failed pass: %v, %d flows left, work kept %v", err, len(ct.flows), !h.staleCT.empty())
	}
	ct.fail = false
	g = h.takeStaleConntrack()
	_, err = h.deleteConntrack(g)
	h.conntrackDeleted(g, err)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := h.aliasOf(z); !ok || !a.Equal(ay) {
		t.Errorf("after the entries went, %s got %s (%v), want y's old %s", z, a, ok, ay)
	}
	if !slices.Equal(ct.flows, []*netlink.ConntrackFlow{keepX80, localX53}) {
		var left []string
		for _, f := range ct.flows {
			left = append(left, f.String())
		}
		t.Errorf("conntrack left: %v, want the flow to %s:80 and the one delivered to the host", left, x)
	}
}

// At start the host takes back the map's aliases and deletes the elements
// it would not write (a value outside the range, an alias another IP
// holds); new aliases come after the highest taken back. An alias handed
// out that never reached the kernel is given up by the sweep unless a
// frontend lists it.
func TestHostReadsAliasesBackAndSweeps(t *testing.T) {
	ctx := context.Background()
	nft := knftables.NewFake(knftables.IPv4Family, HostTable)
	h := newHostWith(hostConfig{}, nft)
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	tx := nft.NewTransaction()
	for _, kv := range [][2]string{{"198.18.100.10", "169.254.192.7"}, {"198.18.100.11", "10.244.0.9"}, {"198.18.100.12", "169.254.192.7"}} {
		tx.Add(&knftables.Element{Map: MapLocalVIPAliases, Key: []string{kv[0]}, Value: []string{kv[1]}})
	}
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	h = newHostWith(hostConfig{}, nft)
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	els, err := nft.ListElements(ctx, "map", MapLocalVIPAliases)
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 1 || els[0].Key[0] != "198.18.100.10" {
		t.Fatalf("map after the start: %v, want 198.18.100.10's element alone", els)
	}
	if a, _ := h.aliasOf(net.ParseIP("198.18.100.10")); a.String() != "169.254.192.7" {
		t.Errorf("198.18.100.10's alias %s, want the one taken back, 169.254.192.7", a)
	}
	z := net.ParseIP("198.18.100.13")
	az, _ := h.aliasOf(z)
	if az.String() != "169.254.192.8" {
		t.Errorf("new alias %s, want 169.254.192.8, after the highest taken back", az)
	}
	h.sweepAliases(func(ip net.IP) bool { return ip.Equal(az) })
	if a, _ := h.aliasOf(z); !a.Equal(az) {
		t.Errorf("the sweep took %s's alias though a frontend lists it (now %s)", z, a)
	}
	h.sweepAliases(func(net.IP) bool { return false })
	if _, held := h.aliases[z.String()]; held {
		t.Errorf("the sweep left %s's alias held, with no element and no frontend", z)
	}
	if _, held := h.aliases["198.18.100.10"]; !held {
		t.Error("the sweep gave up an alias taken back from the kernel")
	}
}

// kernelConntrack deletes the kernel's entries that match and only those,
// in a fresh network namespace.
func TestKernelConntrackDeletesMatching(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	netnstest.Run(t, func() {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatal(err)
		}
		// A rule that looks at conntrack makes the namespace track.
		nft, err := knftables.New(knftables.IPv4Family, "cttest")
		if err != nil {
			t.Fatal(err)
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "out", Type: knftables.PtrTo(knftables.FilterType),
			Hook: knftables.PtrTo(knftables.OutputHook), Priority: knftables.PtrTo(knftables.FilterPriority)})
		tx.Add(&knftables.Rule{Chain: "out", Rule: "ct state new counter"})
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		for _, dst := range []string{"127.0.0.2:9999", "127.0.0.3:9998"} {
			c, err := net.Dial("udp", dst)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
		}
		n, err := kernelConntrack{}.DeleteMatching(func(f *netlink.ConntrackFlow) bool { return f.Forward.DstPort == 9999 })
		if err != nil || n != 1 {
			t.Fatalf("deleted %d entries (%v), want 1", n, err)
		}
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		if len(flows) != 1 || flows[0].Forward.DstPort != 9998 {
			t.Errorf("left %v, want the flow to port 9998 alone", flows)
		}
	})
}

// With proxyAll the host DNATs a local externalIP before a NodePort on the
// same address (kube-proxy's order), except what the bridge hands back
// through the gateway, and SNATs its own connections to an alias to the
// Node IP.
func TestHostRulesForLocalAddresses(t *testing.T) {
	ctx := context.Background()
	nft := knftables.NewFake(knftables.IPv4Family, HostTable)
	h := newHostWith(hostConfig{proxyAll: true, gateway: "seine-gw-test", nodeSource: net.ParseIP("198.18.0.11").To4()}, nft)
	// The nftables part goes in before the routes, which need the gateway
	// (absent here).
	if err := h.reset(ctx); err == nil || !strings.Contains(err.Error(), "seine-gw-test") {
		t.Fatalf("reset without the gateway: %v, want an error naming it", err)
	}
	rules := func(chain string) []string {
		rs, err := nft.ListRules(ctx, chain)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.Rule)
		}
		return out
	}
	pre := rules("prerouting")
	if len(pre) != 2 || !strings.HasPrefix(pre[0], `iifname != "seine-gw-test" ip daddr . meta l4proto . th dport @external-ports fib daddr type local dnat to ip daddr map @local-vip-aliases`) ||
		!strings.Contains(pre[1], "@nodeports") {
		t.Errorf("prerouting: %q, want the local externalIP rule, then the NodePort one", pre)
	}
	if out := rules("output"); len(out) != 2 || !strings.HasPrefix(out[0], "ip daddr . meta l4proto . th dport @external-ports") {
		t.Errorf("output: %q, want the local externalIP rule first", out)
	}
	post := strings.Join(rules("postrouting"), "\n")
	if !strings.Contains(post, `oifname "seine-gw-test" ip daddr 169.254.192.0/18 fib saddr type local snat to 198.18.0.11`) {
		t.Errorf("postrouting:\n%s\nwant the host's own connections to aliases SNATed to the Node IP", post)
	}
}

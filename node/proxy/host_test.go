package proxy

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
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
	// y's frontend goes: its alias leaves the map and is z's to take.
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
	if a, ok := h.aliasOf(z); !ok || !a.Equal(ay) {
		t.Errorf("%s got alias %s (%v), want the freed %s", z, a, ok, ay)
	}
}

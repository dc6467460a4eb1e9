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
	h := &host{nft: nft, elements: map[string]int{}, routes: map[string]int{},
		dirtyElements: map[string]element{}, dirtyRoutes: map[string]net.IP{}}
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

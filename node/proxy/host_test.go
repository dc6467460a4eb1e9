package proxy

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"

	"sigs.k8s.io/knftables"
)

// failingNFT is knftables' fake with the next Run refused, as the kernel
// refuses a transaction (a transient netlink error, a full ruleset).
type failingNFT struct {
	*knftables.Fake
	fail bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		f.fail = false
		return errors.New("refused")
	}
	return f.Fake.Run(ctx, tx)
}

// A failed update leaves the reference counts as they were, so the same
// update made again adds the elements it failed to add, and a later
// removal removes them.
func TestHostUpdateFailureKeepsCounts(t *testing.T) {
	ctx := context.Background()
	nft := &failingNFT{Fake: knftables.NewFake(knftables.IPv4Family, HostTable)}
	h := &host{nft: nft, elements: map[string]int{}, routes: map[string]int{}}
	if err := h.reset(ctx); err != nil {
		t.Fatal(err)
	}
	has := func(e element) bool {
		els, err := nft.ListElements(ctx, "set", e.set)
		if err != nil {
			t.Fatal(err)
		}
		for _, el := range els {
			if slices.Equal(canonicalKey(el.Key), canonicalKey(e.key)) {
				return true
			}
		}
		return false
	}
	reject := rejectElement(net.IPv4(10, 96, 0, 10), 6, 80)
	np := nodePortElement(6, 30080)

	nft.fail = true
	if err := h.update(ctx, []element{reject, np}, nil, nil, nil); err == nil {
		t.Fatal("the refused transaction did not fail the update")
	}
	if len(h.elements) != 0 {
		t.Fatalf("counts after a failed update: %v, want none", h.elements)
	}
	if err := h.update(ctx, []element{reject, np}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !has(reject) || !has(np) {
		t.Fatalf("the update made again did not add the elements: %v", nft.Dump())
	}

	// A removal that fails keeps them counted; made again, it removes them.
	nft.fail = true
	if err := h.update(ctx, nil, []element{reject}, nil, nil); err == nil {
		t.Fatal("the refused removal did not fail the update")
	}
	if h.elements[reject.id()] != 1 {
		t.Fatalf("count of %s after a failed removal: %d, want 1", reject.id(), h.elements[reject.id()])
	}
	if err := h.update(ctx, nil, []element{reject}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if has(reject) || !has(np) {
		t.Fatalf("after the removal made again: reject element there %v, NodePort element there %v", has(reject), has(np))
	}
}

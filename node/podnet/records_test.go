package podnet

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/seine-net/seine/datapath/pipeline"
)

// hookLog records what the policy hook is told, in order.
type hookLog struct{ calls []string }

func (h *hookLog) PodAttached(ns, name string, ofport uint32, _ net.IP, restored bool) {
	h.calls = append(h.calls, fmt.Sprintf("attached %s/%s ofport %d restored %v", ns, name, ofport, restored))
}

func (h *hookLog) PodDetached(ns, name string) {
	h.calls = append(h.calls, fmt.Sprintf("detached %s/%s", ns, name))
}

func (h *hookLog) WaitRealized(context.Context, string, string, string) error { return nil }

func (h *hookLog) take() []string {
	c := h.calls
	h.calls = nil
	return c
}

// Two attachments of one Pod at a time (a StatefulSet Pod created again on
// the Node while the first sandbox's ADD still runs): the one recorded last
// is current; removing an attachment that is not current tells the policy
// hook nothing, removing the current one makes the one left current again,
// and removing the last detaches the Pod.
func TestAttachmentsOfOnePod(t *testing.T) {
	hook := &hookLog{}
	b := New(Config{Policy: hook}, nil, nil, nil, zap.NewNop())
	rec := func(owner string, ofport uint32) podRecord {
		return podRecord{owner: owner, port: "veth-" + owner, pod: pipeline.Pod{OFPort: ofport, IP: net.IPv4(10, 244, 0, byte(ofport))}}
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if got := hook.take(); !slices.Equal(got, want) {
			t.Errorf("%s: the hook was told %q, want %q", step, got, want)
		}
	}
	current := func() uint32 {
		r, ok := b.current("ns/web-0")
		if !ok {
			return 0
		}
		return r.pod.OFPort
	}

	b.remember("ns", "web-0", rec("pod/a/eth0", 3), false)
	b.remember("ns", "web-0", rec("pod/b/eth0", 4), false)
	expect("two ADDs", "attached ns/web-0 ofport 3 restored false", "attached ns/web-0 ofport 4 restored false")
	if c := current(); c != 4 {
		t.Fatalf("current attachment has ofport %d, want 4 (the one made last)", c)
	}
	if a := b.Attachments(); len(a) != 1 || a[0].OFPort != 4 {
		t.Errorf("Attachments %+v, want the current one alone", a)
	}
	b.forget("pod/b/eth0") // the later ADD fails and rolls back
	expect("the current one goes", "attached ns/web-0 ofport 3 restored true")
	if c := current(); c != 3 {
		t.Fatalf("current attachment has ofport %d, want 3", c)
	}
	b.remember("ns", "web-0", rec("pod/b/eth0", 4), false)
	hook.take()
	b.forget("pod/a/eth0") // the earlier sandbox's DEL
	expect("an earlier one goes")
	if c := current(); c != 4 {
		t.Fatalf("current attachment has ofport %d, want 4", c)
	}
	if b.updatePod("ns/web-0", "pod/a/eth0", pipeline.Pod{}) {
		t.Error("updatePod found an attachment that was forgotten")
	}
	b.forget("pod/b/eth0")
	expect("the last one goes", "detached ns/web-0")
	if _, ok := b.current("ns/web-0"); ok {
		t.Error("a Pod without attachments still has a current one")
	}
	b.forget("pod/b/eth0")
	expect("forgotten twice")
	b.remember("ns", "", rec("pod/c/eth0", 5), false)
	expect("no name: nothing recorded")
}

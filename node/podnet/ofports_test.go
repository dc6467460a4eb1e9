package podnet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/pipeline"
)

// TestRequestedOFPortTaken: a port nobody told the backend about holds the
// OpenFlow number the backend requests for a new Pod. The Pod's port gets
// another number from ovs-vswitchd, and its flows are installed again for
// that number.
func TestRequestedOFPortTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := newHarness(t, ctx, zaptest.NewLogger(t))
	other := "sxother" + h.prefix[1:7]
	h.ovs.Run("ovs-vsctl", "add-port", "br-int", other, "--", "set", "interface", other, "type=internal",
		fmt.Sprintf("ofport_request=%d", firstPodOFPort))
	t.Cleanup(func() { _, _ = h.ovs.TryRun("ovs-vsctl", "--if-exists", "del-port", "br-int", other) })
	req := h.request(0, h.netns().Path())
	if _, err := h.be.Add(ctx, req); err != nil {
		t.Fatal(err)
	}
	port, err := h.db.GetPort(ctx, HostVethName(req.ContainerID, req.IfName))
	if err != nil || port == nil {
		t.Fatalf("Pod port: %v %v", port, err)
	}
	if port.OFPort == firstPodOFPort {
		t.Fatalf("Pod port got ofport %d, which another port holds", port.OFPort)
	}
	dump := h.ovs.Run("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", h.ovs.MgmtSocket("br-int"),
		fmt.Sprintf("cookie=%#x/%#x", uint64(pipeline.CategoryPod)<<pipeline.CookieCategoryShift, pipeline.CookieCategoryMask))
	if !strings.Contains(dump, fmt.Sprintf("in_port=%d", port.OFPort)) || strings.Contains(dump, fmt.Sprintf("in_port=%d,", firstPodOFPort)) {
		t.Errorf("Pod flows do not follow ofport %d:\n%s", port.OFPort, dump)
	}
	del := *req
	if err := h.be.Del(ctx, &del); err != nil {
		t.Fatal(err)
	}
	if left := h.leftovers(ctx); len(left) > 1 || (len(left) == 1 && !strings.Contains(left[0], other)) {
		t.Errorf("left behind: %v", left)
	}
}

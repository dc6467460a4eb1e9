package podnet

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// TestDisableTxChecksum turns transmit checksum offload off on one end of
// a veth pair: ethtool then reports every tx-checksum-* feature off there,
// and leaves the other end alone.
func TestDisableTxChecksum(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("ethtool not installed (make deps)")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(); _ = testutils.UnmountNS(n) })
	features := func(ifName string) string {
		var out []byte
		if err := n.Do(func(ns.NetNS) error {
			var err error
			out, err = exec.Command("ethtool", "-k", ifName).Output()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	err = n.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va"}, PeerName: "vb"}); err != nil {
			return err
		}
		return disableTxChecksum("va")
	})
	if err != nil {
		t.Fatal(err)
	}
	off, on := 0, 0
	for _, l := range strings.Split(features("va"), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "tx-checksum-") {
			if strings.Contains(l, ": on") {
				t.Errorf("va: %s", l)
			}
			off++
		}
	}
	for _, l := range strings.Split(features("vb"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "tx-checksum-") && strings.Contains(l, ": on") {
			on++
		}
	}
	if off == 0 || on == 0 {
		t.Errorf("%d tx-checksum features listed on va, %d on on vb:\n%s", off, on, features("va"))
	}
	if err := n.Do(func(ns.NetNS) error { return disableTxChecksum("nonexistent0") }); err == nil {
		t.Error("no error for a missing interface")
	}
}

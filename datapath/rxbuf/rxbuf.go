// Package rxbuf keeps the host's default socket receive buffer,
// net.core.rmem_default, large enough for the userspace (netdev) datapath.
//
// Why it matters: ovs-vswitchd reads each of its non-PMD ports through an
// AF_PACKET socket and never sets that socket's SO_RCVBUF, so the socket
// gets net.core.rmem_default (ip-sysctl.rst; 212992 bytes unless the host
// changed it). The buffer is charged by each queued packet's truesize, and
// with userspace TSO a packet is a TCP segment of up to 64 KiB: three of
// them fill the default. ovs-vswitchd's main thread reads its ports one
// after the other in each turn of its loop, so while it reads or forwards
// elsewhere, a sender that writes a burst overflows the socket and the
// kernel drops the rest (the socket's drop count, ss -0 -m, "d"): TCP
// retransmits, and every port the Node adds lengthens the loop and drops
// more. A few MiB hold a burst of each port between two reads.
//
// The setting belongs to the initial network namespace: written from any
// other it fails, and read from any other it shows the host's value. A
// socket takes the value in force when it is created, so ports that
// ovs-vswitchd opened before a change keep their old buffer until it
// reopens them (restarts).
package rxbuf

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Sysctl is the file of net.core.rmem_default.
const Sysctl = "/proc/sys/net/core/rmem_default"

// DefaultMin is the value, in bytes, that seine keeps at least for the
// userspace datapath (4 MiB: about 60 TSO segments of 64 KiB per port).
const DefaultMin = 4 << 20

// Current returns net.core.rmem_default in bytes.
func Current() (int, error) {
	b, err := os.ReadFile(Sysctl)
	if err != nil {
		return 0, fmt.Errorf("reading net.core.rmem_default: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("net.core.rmem_default %q: %w", strings.TrimSpace(string(b)), err)
	}
	return v, nil
}

// Ensure raises net.core.rmem_default to min bytes when it is lower; it
// never lowers it (an operator's larger value stays). It returns the value
// in force before and whether it wrote. Errors: the file cannot be read,
// or the write fails, e.g. from a network namespace other than the
// initial one (the kernel refuses it there) or without CAP_NET_ADMIN.
func Ensure(min int) (before int, raised bool, err error) {
	if min <= 0 {
		return 0, false, fmt.Errorf("net.core.rmem_default: minimum %d bytes, want > 0", min)
	}
	before, err = Current()
	if err != nil || before >= min {
		return before, false, err
	}
	if err := os.WriteFile(Sysctl, []byte(strconv.Itoa(min)), 0o644); err != nil {
		hint := ""
		if errors.Is(err, os.ErrPermission) || strings.Contains(err.Error(), "invalid argument") {
			hint = " (the setting is the host's: it can only be written from the initial network namespace, with CAP_NET_ADMIN)"
		}
		return before, false, fmt.Errorf("raising net.core.rmem_default from %d to %d bytes%s: %w", before, min, hint, err)
	}
	return before, true, nil
}

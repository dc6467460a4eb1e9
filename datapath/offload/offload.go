// Package offload reads and changes the transmit offloads (checksum and
// TCP segmentation) of network devices, and tells whether ovs-vswitchd runs
// its userspace datapath with TCP segmentation offload (userspace TSO).
//
// Why it matters: the userspace (netdev) datapath reads and writes its
// ports through AF_PACKET sockets (tap file descriptors for internal
// ports). With other_config:userspace-tso-enable=true (ovs-vswitchd.conf.db(5),
// Open_vSwitch table) those sockets carry a virtio-net header, so a 64 KiB
// TCP segment with a partial checksum crosses the bridge as one packet and
// the kernel completes it on the way out. Without it OVS forwards frames
// whose checksum the sender left to an offload as they are, and the
// receiver drops them: every device feeding the bridge must then compute
// checksums itself (tx checksum offload off).
package offload

import (
	"fmt"
	"strings"

	"github.com/safchain/ethtool"
)

// OtherConfigUserspaceTSO is the Open_vSwitch other_config key that turns
// on userspace TSO. ovs-vswitchd reads it once, at start
// (ovs-vswitchd.conf.db(5): "changing this value requires restarting the
// daemon").
const OtherConfigUserspaceTSO = "userspace-tso-enable"

// Ethtool feature names (the kernel's netdev_features_strings).
const (
	featTSO4 = "tx-tcp-segmentation"
)

// UserspaceTSOActive reports whether the running ovs-vswitchd uses userspace
// TSO, judged by an internal port of one of its netdev bridges (a tap
// device; name is its device name): ovs-vswitchd asks the kernel for
// checksum and segmentation offload on its taps (TUNSETOFFLOAD) only when
// userspace TSO is on, so the tap shows tx-tcp-segmentation on exactly
// then. Errors: the device does not exist, ethtool fails.
func UserspaceTSOActive(name string) (bool, error) {
	feats, err := features(name)
	if err != nil {
		return false, err
	}
	return feats[featTSO4], nil
}

// DisableTx turns off every tx-checksum-* feature of the device and every
// TCP segmentation offload (tx-tcp*-segmentation; ethtool -K <dev> tx off
// tso off): what the device sends is then complete, each frame checksummed
// and no larger than the MTU. A feature already off is left alone.
func DisableTx(name string) error {
	feats, err := features(name)
	if err != nil {
		return err
	}
	off := map[string]bool{}
	for f, on := range feats {
		tcpSeg := strings.HasPrefix(f, "tx-tcp") && strings.HasSuffix(f, "segmentation")
		if on && (strings.HasPrefix(f, "tx-checksum") || tcpSeg) {
			off[f] = false
		}
	}
	if len(off) == 0 {
		return nil
	}
	e, err := ethtool.NewEthtool()
	if err != nil {
		return fmt.Errorf("ethtool: %w", err)
	}
	defer e.Close()
	if err := e.Change(name, off); err != nil {
		return fmt.Errorf("disabling transmit offloads on %s: %w", name, err)
	}
	return nil
}

func features(name string) (map[string]bool, error) {
	e, err := ethtool.NewEthtool()
	if err != nil {
		return nil, fmt.Errorf("ethtool: %w", err)
	}
	defer e.Close()
	feats, err := e.Features(name)
	if err != nil {
		return nil, fmt.Errorf("offload features of %s: %w", name, err)
	}
	return feats, nil
}

// featGRO is the ethtool name of generic receive offload.
const featGRO = "rx-gro"

// SetGRO turns generic receive offload of the device on or off (ethtool
// -K <dev> gro on|off); a device already in that state is left alone.
func SetGRO(name string, on bool) error {
	feats, err := features(name)
	if err != nil {
		return err
	}
	if feats[featGRO] == on {
		return nil
	}
	e, err := ethtool.NewEthtool()
	if err != nil {
		return fmt.Errorf("ethtool: %w", err)
	}
	defer e.Close()
	if err := e.Change(name, map[string]bool{featGRO: on}); err != nil {
		return fmt.Errorf("setting GRO of %s: %w", name, err)
	}
	return nil
}

package podnet

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value (linux/ethtool.h).
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with its ifr_data member (linux/if.h): 16
// bytes of name, then the union, 24 bytes on 64-bit.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// disableTxChecksum turns off transmit checksum offload of the interface
// (ethtool -K <if> tx off) with one ETHTOOL_STXCSUM ioctl: the kernel
// clears every tx-checksum-* feature with it (net/ethtool/ioctl.c,
// ethtool_get_feature_mask). Reading the feature names first, as a
// by-name change must, costs a millisecond per interface.
func disableTxChecksum(ifName string) error {
	if len(ifName) >= unix.IFNAMSIZ {
		return fmt.Errorf("disabling checksum offload: interface name %q too long", ifName)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disabling checksum offload on %s: socket: %w", ifName, err)
	}
	defer unix.Close(fd)
	val := ethtoolValue{cmd: unix.ETHTOOL_STXCSUM, data: 0}
	var req ifreqData
	copy(req.name[:], ifName)
	req.data = uintptr(unsafe.Pointer(&val))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req)))
	runtime.KeepAlive(&val)
	if errno != 0 {
		return fmt.Errorf("disabling checksum offload on %s: %w", ifName, errno)
	}
	return nil
}

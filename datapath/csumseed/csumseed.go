// Package csumseed corrects the partial checksums of packets that leave the
// userspace bridge after OVS NATed them, with a tc program on each device
// through which such packets leave.
//
// With userspace TSO a TCP or UDP packet crosses the bridge with a partial
// checksum (Linux's CHECKSUM_PARTIAL; virtio-net's NEEDS_CSUM): the
// checksum field holds only the sum of the IPv4 pseudo-header (RFC 793
// section 3.1, RFC 768), the "seed", and whoever sends the packet on adds
// the transport header and payload to it. OVS 3.1's userspace conntrack
// updates that field on NAT as if it held a complete checksum, so the seed
// ends up off by twice the change and the completed checksum is wrong
// (docs/configuration.md, "NAT of offloaded packets"). A partial seed
// depends on nothing but the packet's current addresses, protocol and
// length, so it can be written anew at the last moment: that is what the
// program does, before the kernel segments and checksums the packet.
//
// The program runs at the egress of the devices the bridge writes leaving
// packets to (the kernel tunnel device, the segmentation port; tc's egress
// hook runs before software segmentation, validate_xmit_skb) and at the
// ingress of the gateway (a tap: what OVS writes to it is received by the
// host). It touches only IPv4 TCP and UDP packets that are not fragments
// and whose checksum is partial. A tc program cannot read the skb's
// ip_summed, so it asks the kernel: bpf_l4_csum_replace with
// BPF_F_PSEUDO_HDR moves a partial field one way and a complete one the
// other (inet_proto_csum_replace4), so one probing update, read back and
// then undone byte for byte, tells them apart. Other packets leave as they
// came.
//
// The filters are classic tc filters (cls_bpf, direct action) on a clsact
// qdisc, not links owned by a file descriptor, so they stay in place while
// the daemon restarts.
package csumseed

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Direction is the hook a Filter runs at.
type Direction uint8

const (
	// Egress: packets the device transmits (what OVS writes to a veth or a
	// kernel tunnel device).
	Egress Direction = iota
	// Ingress: packets the device receives (what OVS writes to a tap).
	Ingress
)

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

func (d Direction) parent() uint32 {
	if d == Ingress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// ProgramName is the name of the loaded program and of its tc filters, as
// `tc filter show dev <device> egress` and `bpftool prog` list them.
const ProgramName = "seine_csumseed"

// filterPriority and filterHandle identify seine's filter on a hook, so
// that Attach replaces its own filter and no other.
const (
	filterPriority = 0xc5e1
	filterHandle   = 1
)

// Program is the loaded program; Close releases the daemon's reference
// (attached filters keep theirs).
type Program struct {
	prog *ebpf.Program
}

// Load verifies and loads the program. On kernels before 5.11, which
// charge BPF memory to RLIMIT_MEMLOCK, it lifts that limit for the process
// first. Errors: the kernel lacks BPF (CONFIG_BPF_SYSCALL) or refuses it
// (no CAP_BPF or CAP_SYS_ADMIN, a verifier error); the error says which.
func Load() (*Program, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("lifting RLIMIT_MEMLOCK for the checksum seed program: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         ProgramName,
		Type:         ebpf.SchedCLS,
		License:      "Apache-2.0",
		Instructions: Instructions(),
	})
	if err != nil {
		return nil, fmt.Errorf("loading the checksum seed program: %w", err)
	}
	return &Program{prog: prog}, nil
}

// Close releases the program; filters attached with it keep running.
func (p *Program) Close() error { return p.prog.Close() }

// Attach puts the program on device's hook, replacing seine's earlier
// filter there, and adds the device's clsact qdisc if it has none. It is
// idempotent. The program reads frames as Ethernet, so device must be an
// Ethernet device (veth, tap, VXLAN); and an Ingress hook belongs only on
// a device whose driver never hands the stack CHECKSUM_COMPLETE packets
// (a tap), where a partial checksum can arrive at all. Errors name the
// device and the step; a device of another link type is refused; a kernel
// without clsact or cls_bpf (CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_BPF)
// fails here.
func (p *Program) Attach(device string, dir Direction) error {
	link, err := netlink.LinkByName(device)
	if err != nil {
		return fmt.Errorf("checksum seed filter: device %s: %w", device, err)
	}
	if t := link.Attrs().EncapType; t != "ether" {
		return fmt.Errorf("checksum seed filter: device %s has link type %q, not Ethernet", device, t)
	}
	idx := link.Attrs().Index
	clsact := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscAdd(clsact); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("clsact qdisc on %s: %w", device, err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: dir.parent(), Handle: filterHandle,
			Priority: filterPriority, Protocol: unix.ETH_P_ALL},
		Fd: p.prog.FD(), Name: ProgramName, DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("checksum seed filter on %s %s: %w", device, dir, err)
	}
	return nil
}

// Attached reports whether device's hook has seine's filter. A missing
// device is an error.
func Attached(device string, dir Direction) (bool, error) {
	link, err := netlink.LinkByName(device)
	if err != nil {
		return false, fmt.Errorf("checksum seed filter: device %s: %w", device, err)
	}
	filters, err := netlink.FilterList(link, dir.parent())
	if err != nil {
		return false, fmt.Errorf("checksum seed filter: tc filters of %s %s: %w", device, dir, err)
	}
	for _, f := range filters {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Priority == filterPriority && b.Name == ProgramName {
			return true, nil
		}
	}
	return false, nil
}

// Detach removes seine's filter from device's hook; a missing device,
// qdisc or filter is not an error (the kernel answers ENOENT, or EINVAL
// without a clsact qdisc; both are taken as "nothing to remove"). The
// clsact qdisc stays (other filters may use it).
func Detach(device string, dir Direction) error {
	link, err := netlink.LinkByName(device)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("checksum seed filter: device %s: %w", device, err)
	}
	filter := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index,
		Parent: dir.parent(), Handle: filterHandle, Priority: filterPriority, Protocol: unix.ETH_P_ALL}}
	if err := netlink.FilterDel(filter); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("removing the checksum seed filter from %s %s: %w", device, dir, err)
	}
	return nil
}

// Stack layout of the program (offsets from the frame pointer R10).
const (
	stackSeed  = -8  // u64: the pseudo-header sum, unfolded
	stackField = -16 // u16: the checksum field as it came
	stackProbe = -24 // u16: the field after the probing update; then the new seed
	stackHdr   = -48 // 22 bytes: EtherType and the IPv4 header without options
	hdrLen     = 22
)

// Offsets in the bytes copied to stackHdr (the frame from byte 12).
const (
	hdrEtherType = 0  // 2 bytes
	hdrVerIHL    = 2  // version and header length
	hdrTotLen    = 4  // IPv4 total length
	hdrFrag      = 8  // flags and fragment offset
	hdrProto     = 11 // protocol
	hdrSaddr     = 14 // 4 bytes
	hdrDaddr     = 18 // 4 bytes
)

// probeDelta is what the probing update adds; on a partial field it moves
// the field up by it (one's complement), on a complete one down.
const probeDelta = 0x0100

// BPF helper flags (include/uapi/linux/bpf.h).
const (
	fPseudoHdr     = 1 << 4 // BPF_F_PSEUDO_HDR
	fieldSize2     = 2      // BPF_F_HDR_FIELD_MASK: a 2-byte field
	fRecomputeCsum = 1      // BPF_F_RECOMPUTE_CSUM
)

// tc verdicts (include/uapi/linux/pkt_cls.h).
const (
	tcActOK   = 0 // TC_ACT_OK
	tcActShot = 2 // TC_ACT_SHOT
)

// skbLen is the offset of struct __sk_buff's len (the frame's length,
// GSO packets whole).
const skbLen = 0

// Instructions returns the program (a tc classifier in direct-action mode
// that returns TC_ACT_OK, or TC_ACT_SHOT for the packet it could not
// restore after probing it). Registers: R6 the skb, R7 the checksum
// field's offset, R8 the protocol, R9 the IPv4 header length in bytes.
func Instructions() asm.Instructions {
	const out, drop = "out", "drop"
	// 0x0800 as a native-endian load of its wire bytes.
	etherTypeIPv4 := int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))
	load := func(off asm.Register, stack int16, n int32) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Reg(asm.R2, off),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, int32(stack)),
			asm.Mov.Imm(asm.R4, n),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, out),
		}
	}
	store := func(stack int16, flags int32) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Reg(asm.R2, asm.R7),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, int32(stack)),
			asm.Mov.Imm(asm.R4, 2),
			asm.Mov.Imm(asm.R5, flags),
			asm.FnSkbStoreBytes.Call(),
		}
	}
	// addWord adds the big-endian 16-bit word at stackHdr+off to R5.
	addWord := func(off int16) asm.Instructions {
		return asm.Instructions{
			asm.LoadMem(asm.R1, asm.RFP, stackHdr+off, asm.Half),
			asm.HostTo(asm.BE, asm.R1, asm.Half),
			asm.Add.Reg(asm.R5, asm.R1),
		}
	}
	fold := asm.Instructions{ // R5 = (R5 & 0xffff) + (R5 >> 16)
		asm.Mov.Reg(asm.R1, asm.R5),
		asm.RSh.Imm(asm.R1, 16),
		asm.And.Imm(asm.R5, 0xffff),
		asm.Add.Reg(asm.R5, asm.R1),
	}

	var p asm.Instructions
	p = append(p, asm.Mov.Reg(asm.R6, asm.R1))
	// The EtherType and the IPv4 header.
	p = append(p, asm.Mov.Imm(asm.R7, 12))
	p = append(p, load(asm.R7, stackHdr, hdrLen)...)
	p = append(p,
		asm.LoadMem(asm.R1, asm.RFP, stackHdr+hdrEtherType, asm.Half),
		asm.JNE.Imm(asm.R1, etherTypeIPv4, out),
		asm.LoadMem(asm.R9, asm.RFP, stackHdr+hdrVerIHL, asm.Byte),
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.And.Imm(asm.R1, 0xf0),
		asm.JNE.Imm(asm.R1, 0x40, out),
		asm.And.Imm(asm.R9, 0x0f),
		asm.JLT.Imm(asm.R9, 5, out),
		asm.LSh.Imm(asm.R9, 2),
		// Fragments: the sender computed their checksum in full.
		asm.LoadMem(asm.R1, asm.RFP, stackHdr+hdrFrag, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.And.Imm(asm.R1, 0x3fff),
		asm.JNE.Imm(asm.R1, 0, out),
		// TCP: the field is at byte 16 of its header; UDP: byte 6.
		asm.LoadMem(asm.R8, asm.RFP, stackHdr+hdrProto, asm.Byte),
		asm.Mov.Imm(asm.R7, 14+16),
		asm.JEq.Imm(asm.R8, unix.IPPROTO_TCP, "proto_ok"),
		asm.Mov.Imm(asm.R7, 14+6),
		asm.JNE.Imm(asm.R8, unix.IPPROTO_UDP, out),
		asm.Add.Reg(asm.R7, asm.R9).WithSymbol("proto_ok"),
		// The IPv4 total length (R5) must hold the checksum field (0: a
		// GSO packet larger than IPv4 can say), and the frame the whole
		// packet (not truncated; a GSO skb's len is the whole packet).
		asm.LoadMem(asm.R5, asm.RFP, stackHdr+hdrTotLen, asm.Half),
		asm.HostTo(asm.BE, asm.R5, asm.Half),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Add.Imm(asm.R1, 2-14),
		asm.JGT.Reg(asm.R1, asm.R5, out),
		asm.LoadMem(asm.R2, asm.R6, skbLen, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R5),
		asm.Add.Imm(asm.R1, 14),
		asm.JGT.Reg(asm.R1, asm.R2, out),
		// The seed: protocol, transport length, source, destination.
		asm.Sub.Reg(asm.R5, asm.R9),
		asm.Add.Reg(asm.R5, asm.R8),
	)
	for _, off := range []int16{hdrSaddr, hdrSaddr + 2, hdrDaddr, hdrDaddr + 2} {
		p = append(p, addWord(off)...)
	}
	p = append(p, asm.StoreMem(asm.RFP, stackSeed, asm.R5, asm.DWord))
	// The field as it came; a UDP field of 0 means no checksum.
	p = append(p, load(asm.R7, stackField, 2)...)
	p = append(p,
		asm.LoadMem(asm.R1, asm.RFP, stackField, asm.Half),
		asm.JNE.Imm(asm.R8, unix.IPPROTO_UDP, "probe"),
		asm.JEq.Imm(asm.R1, 0, out),
		// Probe: the kernel moves a partial field up by probeDelta, a
		// complete one down.
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("probe"),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, probeDelta),
		asm.Mov.Imm(asm.R5, fPseudoHdr|fieldSize2),
		asm.FnL4CsumReplace.Call(),
		asm.JNE.Imm(asm.R0, 0, out),
	)
	// Read the field back, then undo the probe byte for byte whatever
	// the read found (R8, the protocol, is no longer needed: it keeps the
	// read's result across the undo). BPF_F_RECOMPUTE_CSUM undoes what the
	// probe did to a CHECKSUM_COMPLETE skb's csum as well. A packet the
	// undo failed on would leave with a wrong checksum: it is dropped.
	p = append(p, load(asm.R7, stackProbe, 2)[:6]...)
	p = append(p, asm.Mov.Reg(asm.R8, asm.R0))
	p = append(p, store(stackField, fRecomputeCsum)...)
	p = append(p,
		asm.JNE.Imm(asm.R0, 0, drop),
		asm.JNE.Imm(asm.R8, 0, out),
		asm.LoadMem(asm.R1, asm.RFP, stackProbe, asm.Half),
		asm.LoadMem(asm.R2, asm.RFP, stackField, asm.Half),
		asm.Sub.Reg(asm.R1, asm.R2),
		asm.And.Imm(asm.R1, 0xffff),
		asm.JGE.Imm(asm.R1, 0x8000, out), // moved down: complete
		asm.JEq.Imm(asm.R1, 0, out),
		// Partial: write the seed, folded to 16 bits, in network order.
		asm.LoadMem(asm.R5, asm.RFP, stackSeed, asm.DWord),
	)
	p = append(p, fold...)
	p = append(p, fold...)
	p = append(p,
		asm.HostTo(asm.BE, asm.R5, asm.Half),
		asm.StoreMem(asm.RFP, stackProbe, asm.R5, asm.Half),
	)
	p = append(p, store(stackProbe, 0)...)
	p = append(p,
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol(out),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol(drop),
		asm.Return(),
	)
	return p
}

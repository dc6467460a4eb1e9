package openflow

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	of13 "github.com/contiv/libOpenflow/openflow13"
)

// MeterEntry is one OpenFlow meter (OpenFlow 1.3 section 5.7) with a
// single drop band: packets that find the band's token bucket empty are
// dropped. Flows send packets through it with the Meter action.
type MeterEntry struct {
	// ID is the meter's number, 1..0xffff0000 (OFPM_MAX).
	ID uint32
	// RateKbps is the band's rate in kilobits (1,000 bits) per second,
	// at least 1.
	RateKbps uint32
	// BurstKbits is the band's bucket in kilobits: how much may pass at
	// once above the rate. It must hold the largest packet the meter sees
	// (a 64 KiB segment with userspace TSO is 525 kbits), or that packet is
	// always dropped.
	BurstKbits uint32
}

func (m MeterEntry) String() string {
	return fmt.Sprintf("meter=%d kbps burst bands=type=drop rate=%d burst_size=%d", m.ID, m.RateKbps, m.BurstKbits)
}

// Meter sends the packet through meter ID before the flow's other actions
// (the OpenFlow 1.3 meter instruction, ovs-actions(7) "meter:ID"); a
// packet the meter drops goes no further. It must be a flow's first
// action, and the meter must exist when the flow is added.
type Meter struct{ ID uint32 }

func (Meter) isAction() {}

// MeterFeatures is what the switch reports of its meters
// (OFPMP_METER_FEATURES, OpenFlow 1.3 section 7.3.5.13).
type MeterFeatures struct {
	// MaxMeter is how many meters the switch holds (max_meter); 0 means
	// the datapath has none (OVS reports 0 when its probe finds the kernel
	// datapath without working meters).
	MaxMeter uint32
	// DropBand reports whether drop bands are supported.
	DropBand bool
	// Kbps and Burst report the OFPMF_KBPS and OFPMF_BURST capabilities.
	Kbps, Burst bool
}

// Usable reports whether n meters of the form MeterEntry describes (a
// kbps drop band with a burst size) fit.
func (f MeterFeatures) Usable(n uint32) bool {
	return f.MaxMeter >= n && f.DropBand && f.Kbps && f.Burst
}

// multipart type OFPMP_METER_FEATURES.
const multipartMeterFeatures = 11

// MeterFeatures asks the switch what meters it offers.
func (c *Client) MeterFeatures(ctx context.Context) (MeterFeatures, error) {
	cn, err := c.getConn(ctx)
	if err != nil {
		return MeterFeatures{}, err
	}
	var f MeterFeatures
	err = cn.multipart(ctx, multipartMeterFeatures, emptyBody{}, func(b []byte) error {
		var derr error
		f, derr = decodeMeterFeatures(b)
		return derr
	})
	if err != nil {
		return MeterFeatures{}, fmt.Errorf("openflow: meter features: %w", err)
	}
	return f, nil
}

// decodeMeterFeatures reads an OFPMP_METER_FEATURES reply body:
// max_meter(4) band_types(4) capabilities(4) max_bands(1) max_color(1)
// pad(2).
func decodeMeterFeatures(b []byte) (MeterFeatures, error) {
	if len(b) < 16 {
		return MeterFeatures{}, fmt.Errorf("short meter features reply (%d bytes)", len(b))
	}
	bands, capa := binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint32(b[8:12])
	return MeterFeatures{
		MaxMeter: binary.BigEndian.Uint32(b[0:4]),
		DropBand: bands&(1<<of13.OFPMBT13_DROP) != 0,
		Kbps:     capa&of13.OFPMF13_KBPS != 0,
		Burst:    capa&of13.OFPMF13_BURST != 0,
	}, nil
}

func encodeMeterMod(cmd uint16, m MeterEntry) (*of13.MeterMod, error) {
	if m.ID == 0 || m.ID > of13.OFPM13_MAX {
		return nil, fmt.Errorf("meter id %d is outside 1..%d", m.ID, uint32(of13.OFPM13_MAX))
	}
	mm := of13.NewMeterMod()
	mm.Command = cmd
	mm.MeterId = m.ID
	if cmd == of13.OFPMC_DELETE {
		return mm, nil
	}
	if m.RateKbps == 0 || m.BurstKbits == 0 {
		return nil, fmt.Errorf("meter %d: rate %d kbps and burst %d kbits must both be positive", m.ID, m.RateKbps, m.BurstKbits)
	}
	mm.Flags = of13.OFPMF13_KBPS | of13.OFPMF13_BURST | of13.OFPMF13_STATS
	band := &of13.MeterBandDrop{MeterBandHeader: of13.MeterBandHeader{
		Type: of13.OFPMBT13_DROP, Length: of13.METER_BAND_LEN, Rate: m.RateKbps, BurstSize: m.BurstKbits}}
	mm.AddMeterBand(band)
	return mm, nil
}

// EnsureMeter makes meter m.ID exist with m's band: it adds the meter, or
// modifies it in place when the id is taken. It never deletes and adds
// again, because deleting a meter deletes every flow that uses it
// (OpenFlow 1.3 section 6.6). Meter mods travel on their own, followed by
// a barrier: OVS does not take them in bundles. The error wraps the
// switch's *OFError (e.g. OFPMMFC_OUT_OF_METERS).
func (c *Client) EnsureMeter(ctx context.Context, m MeterEntry) error {
	err := c.meterMod(ctx, of13.OFPMC_ADD, m)
	var oe *OFError
	if errors.As(err, &oe) && oe.Type == of13.ET_METER_MOD_FAILED && oe.Code == meterExists {
		err = c.meterMod(ctx, of13.OFPMC_MODIFY, m)
	}
	if err != nil {
		return fmt.Errorf("openflow: %s: %w", m, err)
	}
	return nil
}

// DeleteMeter removes meter id, and with it every flow that uses it
// (OpenFlow 1.3 section 6.6); an id not in use is not an error for OVS.
func (c *Client) DeleteMeter(ctx context.Context, id uint32) error {
	if err := c.meterMod(ctx, of13.OFPMC_DELETE, MeterEntry{ID: id}); err != nil {
		return fmt.Errorf("openflow: delete meter %d: %w", id, err)
	}
	return nil
}

func (c *Client) meterMod(ctx context.Context, cmd uint16, m MeterEntry) error {
	mm, err := encodeMeterMod(cmd, m)
	if err != nil {
		return err
	}
	cn, err := c.getConn(ctx)
	if err != nil {
		return err
	}
	return cn.request(ctx, ofMessage{mm, &mm.Header})
}

// MeterStats are one meter's counters (OFPMP_METER, OpenFlow 1.3 section
// 7.3.5.12): what went in, and what its drop band dropped.
type MeterStats struct {
	ID uint32
	// Flows is the number of flows that use the meter.
	Flows uint32
	// Packets and Bytes entered the meter.
	Packets, Bytes uint64
	// DroppedPackets and DroppedBytes are the drop band's counters (the
	// first band's; MeterEntry has one).
	DroppedPackets, DroppedBytes uint64
}

// multipart type OFPMP_METER.
const multipartMeter = 9

// meterStatsRequest is the body of an OFPMP_METER request: meter_id(4)
// pad(4).
type meterStatsRequest struct{ id uint32 }

func (meterStatsRequest) Len() uint16 { return 8 }
func (r meterStatsRequest) MarshalBinary() ([]byte, error) {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, r.id)
	return b, nil
}
func (meterStatsRequest) UnmarshalBinary([]byte) error { return nil }

// MeterStats reads the counters of every meter on the switch.
func (c *Client) MeterStats(ctx context.Context) ([]MeterStats, error) {
	cn, err := c.getConn(ctx)
	if err != nil {
		return nil, err
	}
	out, err := multipartEntries(ctx, cn, multipartMeter, meterStatsRequest{of13.OFPM13_ALL}, decodeMeterStats)
	if err != nil {
		return nil, fmt.Errorf("openflow: meter stats: %w", err)
	}
	return out, nil
}

// decodeMeterStats reads the entries of one OFPMP_METER reply body:
// meter_id(4) len(2) pad(6) flow_count(4) packet_in_count(8)
// byte_in_count(8) duration_sec(4) duration_nsec(4), then per band
// packet_band_count(8) byte_band_count(8).
func decodeMeterStats(b []byte) ([]MeterStats, error) {
	var out []MeterStats
	for len(b) > 0 {
		if len(b) < 40 {
			return nil, fmt.Errorf("truncated meter stats entry (%d bytes)", len(b))
		}
		l := int(binary.BigEndian.Uint16(b[4:6]))
		if l < 40 || l > len(b) || (l-40)%16 != 0 {
			return nil, fmt.Errorf("bad meter stats entry length %d", l)
		}
		s := MeterStats{
			ID:      binary.BigEndian.Uint32(b[0:4]),
			Flows:   binary.BigEndian.Uint32(b[12:16]),
			Packets: binary.BigEndian.Uint64(b[16:24]),
			Bytes:   binary.BigEndian.Uint64(b[24:32]),
		}
		if l >= 56 {
			s.DroppedPackets = binary.BigEndian.Uint64(b[40:48])
			s.DroppedBytes = binary.BigEndian.Uint64(b[48:56])
		}
		out = append(out, s)
		b = b[l:]
	}
	return out, nil
}

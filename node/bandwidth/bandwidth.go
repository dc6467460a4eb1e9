// Package bandwidth shapes a Pod's traffic to the rates of the CNI
// "bandwidth" capability (CNI conventions, "Bandwidth management"), which
// kubelet's runtime fills from the Pod's kubernetes.io/ingress-bandwidth and
// kubernetes.io/egress-bandwidth annotations. The daemon does it itself
// instead of chaining the bandwidth plugin.
//
// Each direction gets a token bucket filter (tc-tbf(8)) as the root qdisc
// of the interface the traffic leaves through:
//
//   - into the Pod (ingress): the host end of the Pod's veth, where the
//     bridge hands the Pod its packets;
//   - out of the Pod (egress): the Pod's own interface, inside its network
//     namespace.
//
// The bandwidth plugin shapes egress on the host end instead, redirecting
// its ingress to an ifb device. That works with the kernel datapath but not
// with the userspace one: ovs-vswitchd reads the host end through an
// AF_PACKET socket, which gets every packet before tc's ingress hook runs,
// so the bridge forwards the Pod's traffic unshaped (measured: 7 Gbit/s
// through a 100 Mbit/s limit). Shaping at the Pod's interface works with
// both datapaths and pushes back on the Pod's sockets instead of dropping.
//
// A Pod with CAP_NET_ADMIN can replace its own qdisc. An OpenFlow meter on
// the Pod's port (EgressMeter gives its band) backs the limit up: it
// drops what exceeds the limit by more than the tbf ever lets through.
package bandwidth

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/vishvananda/netlink"
)

// Limits are the rates of the bandwidth capability: rates in bits per
// second, bursts in bits; a zero rate leaves that direction alone.
type Limits struct {
	IngressRate  uint64 `json:"ingressRate"`
	IngressBurst uint64 `json:"ingressBurst"`
	EgressRate   uint64 `json:"egressRate"`
	EgressBurst  uint64 `json:"egressBurst"`
}

// IsZero reports whether l shapes nothing.
func (l Limits) IsZero() bool { return l.IngressRate == 0 && l.EgressRate == 0 }

const (
	// minBurst is the smallest bucket in bytes: a 64 KiB segment of
	// userspace or kernel TSO passes whole.
	minBurst = 64 << 10
	// defaultBurstSeconds is a burst's length, at the rate, when none is
	// given: 100 ms.
	defaultBurstSeconds = 0.1
	// maxBurstSeconds bounds a burst's length at the rate (tbf holds it in
	// 32-bit clock ticks).
	maxBurstSeconds = 60
	// latencySeconds is how long a packet may wait in the queue: 25 ms, as
	// the bandwidth plugin and kubelet's old kubenet shaper chose.
	latencySeconds = 0.025
	// minRate is the slowest rate, in bits per second, worth a bucket.
	minRate = 1000
)

// Parse decodes and validates a bandwidth runtimeConfig value (nil or empty
// gives zero Limits). A rate below 1,000 bits/s, or a burst that lasts more
// than 60 s at its rate, is an error naming the field; a burst of 0 or of
// 2^32-1 bits (what containerd sends when the Pod sets no burst) means the
// default, 100 ms at the rate.
func Parse(raw json.RawMessage) (Limits, error) {
	var l Limits
	if len(raw) == 0 || string(raw) == "null" {
		return l, nil
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return l, fmt.Errorf("bandwidth: %w", err)
	}
	for _, d := range []struct {
		name        string
		rate, burst uint64
	}{{"ingress", l.IngressRate, l.IngressBurst}, {"egress", l.EgressRate, l.EgressBurst}} {
		if d.rate == 0 {
			continue
		}
		if d.rate < minRate {
			return l, fmt.Errorf("bandwidth: %sRate %d bits/s is below %d", d.name, d.rate, minRate)
		}
		if d.burst != 0 && d.burst != math.MaxUint32 && float64(d.burst)/float64(d.rate) > maxBurstSeconds {
			return l, fmt.Errorf("bandwidth: %sBurst %d bits lasts more than %d s at %d bits/s", d.name, d.burst, maxBurstSeconds, d.rate)
		}
	}
	return l, nil
}

// tbf returns the root qdisc for link that shapes to rate (bits/s, at
// least 1,000) with a bucket of burst bits (0 or 2^32-1: the default); the
// bucket is at least 64 KiB and at most 60 s at the rate, and the queue
// holds what the rate sends in 25 ms beside the bucket.
func tbf(linkIndex int, rate, burst uint64) *netlink.Tbf {
	bytesPerSec := rate / 8
	bucket := bucketBytes(rate, burst)
	limit := min(uint64(float64(bytesPerSec)*latencySeconds)+bucket, math.MaxUint32)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: linkIndex, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bytesPerSec,
		Limit:      uint32(limit),
		Buffer:     netlink.Xmittime(bytesPerSec, uint32(bucket)),
	}
}

// bucketBytes is the token bucket, in bytes, of a limit of rate bits/s
// with a burst of burst bits (0 or 2^32-1: 100 ms at the rate): at least a
// TSO segment, at most 60 s at the rate (which still holds an MTU-sized
// packet at the slowest rate).
func bucketBytes(rate, burst uint64) uint64 {
	bytesPerSec := rate / 8
	bucket := burst / 8
	if burst == 0 || burst == math.MaxUint32 {
		bucket = uint64(float64(bytesPerSec) * defaultBurstSeconds)
	}
	return min(max(bucket, minBurst), uint64(float64(bytesPerSec)*maxBurstSeconds), math.MaxUint32)
}

// meterSlack is how far above the limit the egress meter's rate lies, so
// that packets the Pod's tbf let through on time are never dropped when
// they reach the bridge bunched together.
const meterSlack = 1.1

// EgressMeter returns the band of the OpenFlow meter that backs up the
// egress limit rate (bits/s) with burst (bits; 0 or 2^32-1: the default),
// in kilobits per second and kilobits: the rate plus 10%, and twice the
// tbf's bucket. A Pod whose own qdisc shapes its traffic never reaches
// the band; one that removed the qdisc (it needs CAP_NET_ADMIN in its
// network namespace) is policed to the band's rate. A policer drops where
// tbf queues, so TCP through the meter alone runs below the limit.
func EgressMeter(rate, burst uint64) (rateKbps, burstKbits uint32) {
	r := math.Ceil(float64(rate) * meterSlack / 1000)
	b := math.Ceil(float64(2*bucketBytes(rate, burst)) * 8 / 1000)
	return uint32(min(r, math.MaxUint32)), uint32(min(b, math.MaxUint32))
}

// Shape makes a tbf the root qdisc of the link named ifName (in the
// calling goroutine's network namespace), replacing what was there.
func Shape(ifName string, rate, burst uint64) error {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("shaping %s: %w", ifName, err)
	}
	if err := netlink.QdiscReplace(tbf(link.Attrs().Index, rate, burst)); err != nil {
		return fmt.Errorf("shaping %s to %d bits/s: %w", ifName, rate, err)
	}
	return nil
}

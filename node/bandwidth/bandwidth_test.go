package bandwidth

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/tests/netnstest"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Limits
		err      string
	}{
		{name: "absent", in: ``},
		{name: "egress only", in: `{"egressRate":10000000,"egressBurst":4294967295}`, want: Limits{EgressRate: 1e7, EgressBurst: math.MaxUint32}},
		{name: "both", in: `{"ingressRate":2000000,"ingressBurst":800000,"egressRate":1000,"egressBurst":0}`,
			want: Limits{IngressRate: 2e6, IngressBurst: 8e5, EgressRate: 1000}},
		{name: "slow", in: `{"ingressRate":999}`, err: "ingressRate 999 bits/s is below 1000"},
		{name: "long burst", in: `{"egressRate":1000000,"egressBurst":61000000}`, err: "egressBurst 61000000 bits lasts more than 60 s"},
		{name: "negative", in: `{"egressRate":-1}`, err: "bandwidth: json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(json.RawMessage(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if got.IsZero() != (tc.want == Limits{}) {
				t.Errorf("IsZero = %v", got.IsZero())
			}
		})
	}
}

// TestShape puts the qdisc on a real veth and reads it back: rate in
// bytes per second, the default bucket 100 ms at the rate, a bucket never
// below 64 KiB, and a replaced qdisc on a second call.
func TestShape(t *testing.T) {
	netnstest.Run(t, func() {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bw0"}, PeerName: "bw1"}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			rate, burst uint64
			wantBucket  uint32 // bytes
		}{
			{rate: 100e6, burst: math.MaxUint32, wantBucket: 1_250_000}, // 100 ms at 12.5 MB/s
			{rate: 1e6, burst: 0, wantBucket: 64 << 10},                 // 12.5 KB is below the floor
			{rate: 100e6, burst: 8e6, wantBucket: 1_000_000},            // as given
		} {
			if err := Shape("bw0", tc.rate, tc.burst); err != nil {
				t.Fatal(err)
			}
			link, _ := netlink.LinkByName("bw0")
			qs, err := netlink.QdiscList(link)
			if err != nil {
				t.Fatal(err)
			}
			var tbf *netlink.Tbf
			for _, q := range qs {
				if q, ok := q.(*netlink.Tbf); ok && q.Parent == netlink.HANDLE_ROOT {
					tbf = q
				}
			}
			if tbf == nil {
				t.Fatalf("rate %d: no root tbf among %v", tc.rate, qs)
			}
			if tbf.Rate != tc.rate/8 {
				t.Errorf("rate %d: qdisc rate %d bytes/s, want %d", tc.rate, tbf.Rate, tc.rate/8)
			}
			// The bucket comes back through clock ticks: allow 1%.
			if got := netlink.Xmitsize(tbf.Rate, tbf.Buffer); math.Abs(float64(got)-float64(tc.wantBucket)) > float64(tc.wantBucket)/100 {
				t.Errorf("rate %d burst %d: bucket %d bytes, want %d", tc.rate, tc.burst, got, tc.wantBucket)
			}
		}
		if err := Shape("nope0", 1e6, 0); err == nil || !strings.Contains(err.Error(), "shaping nope0") {
			t.Errorf("missing link: %v", err)
		}
	})
}

func TestEgressMeter(t *testing.T) {
	for _, c := range []struct {
		rate, burst      uint64
		wantKbps, wantKb uint32
	}{
		// 20 Mbit/s, default burst (100 ms: 250,000 bytes): 22,000 kbps
		// and twice 2,000 kbits.
		{20_000_000, 0, 22_000, 4_000},
		{20_000_000, math.MaxUint32, 22_000, 4_000},
		// A small burst is raised to a 64 KiB segment: 2 × 524.288 kbits.
		{1_000_000, 8_000, 1_100, 1_049},
		// The slowest rate: 1.1 kbps, rounded up; the bucket is 60 s at
		// the rate (7,500 bytes), twice that is 120 kbits.
		{1_000, 0, 2, 120},
		// 10 Gbit/s with a 1 Gbit burst: the bucket is 125 MB, twice that
		// is 2,000,000 kbits.
		{10_000_000_000, 1_000_000_000, 11_000_000, 2_000_000},
	} {
		kbps, kb := EgressMeter(c.rate, c.burst)
		if kbps != c.wantKbps || kb != c.wantKb {
			t.Errorf("EgressMeter(%d, %d) = %d kbps, %d kbits; want %d, %d", c.rate, c.burst, kbps, kb, c.wantKbps, c.wantKb)
		}
		// Never below the tbf it backs up.
		if uint64(kbps)*1000 < c.rate || uint64(kb)*1000 < 8*bucketBytes(c.rate, c.burst) {
			t.Errorf("EgressMeter(%d, %d) = %d kbps, %d kbits: below the tbf", c.rate, c.burst, kbps, kb)
		}
	}
}

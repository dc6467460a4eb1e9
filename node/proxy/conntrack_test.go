package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/seine-net/seine/datapath/ovsctl"
	"github.com/seine-net/seine/datapath/pipeline"
)

func TestStaleConns(t *testing.T) {
	vip, ext := net.ParseIP("10.96.0.10"), net.ParseIP("198.18.5.5")
	ep := func(last byte) pipeline.ServiceEndpoint {
		return pipeline.ServiceEndpoint{IP: net.IPv4(10, 244, 1, last), Port: 5353}
	}
	udp := func(vips []net.IP, eps ...pipeline.ServiceEndpoint) pipeline.ServicePort {
		return pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: vips, Endpoints: eps}
	}
	many := func(n int) []pipeline.ServiceEndpoint {
		var out []pipeline.ServiceEndpoint
		for i := 0; i < n; i++ {
			out = append(out, ep(byte(i+1)))
		}
		return out
	}
	show := func(fs []ctFlush) string {
		var s []string
		for _, f := range fs {
			s = append(s, fmt.Sprintf("%s|%s", f.orig, f.reply))
		}
		return strings.Join(s, " ")
	}
	const o10 = "ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_dst=53"
	reject := pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Action: pipeline.ServiceReject}
	const untranslated = o10 + "|ct_nw_src=10.96.0.10,ct_nw_proto=17,ct_tp_src=53"
	for _, tc := range []struct {
		name     string
		old, cur pipeline.ServicePort
		serving  []pipeline.ServiceEndpoint // nil: cur.Endpoints
		want     string
	}{
		{"unchanged", udp([]net.IP{vip}, ep(1), ep(2)), udp([]net.IP{vip}, ep(2), ep(1)), nil, ""},
		{"an endpoint added", udp([]net.IP{vip}, ep(1)), udp([]net.IP{vip}, ep(1), ep(2)), nil, ""},
		{"an endpoint gone", udp([]net.IP{vip}, ep(1), ep(2)), udp([]net.IP{vip}, ep(2)), nil,
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"the target port changed", udp([]net.IP{vip}, ep(1)),
			udp([]net.IP{vip}, pipeline.ServiceEndpoint{IP: ep(1).IP, Port: 5354}), nil,
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"a VIP gone", udp([]net.IP{vip, ext}, ep(1)), udp([]net.IP{vip}, ep(1)), nil,
			"ct_nw_dst=198.18.5.5,ct_nw_proto=17,ct_tp_dst=53|"},
		{"the port removed", udp([]net.IP{vip}, ep(1)), pipeline.ServicePort{}, nil, o10 + "|"},
		{"every endpoint gone: rejected now", udp([]net.IP{vip}, ep(1)), reject, nil,
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"more endpoints gone than flushed one by one", udp([]net.IP{vip}, many(maxEndpointFlushes+1)...),
			udp([]net.IP{vip}), nil, o10 + "|"},
		{"an endpoint left the choice but still serves (terminating, policy, hints)", udp([]net.IP{vip}, ep(1), ep(2)),
			udp([]net.IP{vip}, ep(2)), []pipeline.ServiceEndpoint{ep(1), ep(2)}, ""},
		{"first programmed: what went untranslated before", pipeline.ServicePort{}, udp([]net.IP{vip}, ep(1)), nil, untranslated},
		{"endpoints after none: what was rejected", reject, udp([]net.IP{vip}, ep(1)), nil, untranslated},
		{"rejecting still", reject, reject, nil, ""},
		{"TCP: nothing", pipeline.ServicePort{Protocol: 6, Port: 80, VIPs: []net.IP{vip}, Endpoints: []pipeline.ServiceEndpoint{ep(1)}},
			pipeline.ServicePort{}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serving := tc.serving
			if serving == nil {
				serving = tc.cur.Endpoints
			}
			if got := show(staleConns(tc.old, tc.cur, serving)); got != tc.want {
				t.Errorf("flushes %q, want %q", got, tc.want)
			}
		})
	}
}

// recordingConntrack answers a dump with entries and records flushes.
type recordingConntrack struct {
	entries []ovsctl.CTEntry
	flushed []string
}

func (r *recordingConntrack) FlushConntrack(_ context.Context, _ uint16, orig, reply ovsctl.CTTuple) error {
	r.flushed = append(r.flushed, orig.String()+"|"+reply.String())
	return nil
}

func (r *recordingConntrack) DumpConntrack(context.Context, uint16) ([]ovsctl.CTEntry, error) {
	return r.entries, nil
}

// After a restart, the connections to a programmed UDP VIP whose other end
// is not a serving endpoint are flushed, each by its exact tuple; the
// others, TCP ones and those to unknown VIPs, stay.
func TestReconcileConntrack(t *testing.T) {
	vip, client := net.ParseIP("10.96.0.10"), net.ParseIP("10.244.0.3")
	live, gone := pipeline.ServiceEndpoint{IP: net.ParseIP("10.244.1.5"), Port: 5353}, net.ParseIP("10.244.2.5")
	cport := uint16(40000)
	entry := func(proto uint8, dst net.IP, dport uint16, replySrc net.IP, sport uint16) ovsctl.CTEntry {
		cport++
		return ovsctl.CTEntry{Zone: pipeline.ConntrackZone,
			Orig:  ovsctl.CTTuple{Src: client, Dst: dst, Proto: proto, SrcPort: cport, DstPort: dport},
			Reply: ovsctl.CTTuple{Src: replySrc, Dst: client, Proto: proto, SrcPort: sport, DstPort: cport}}
	}
	ct := &recordingConntrack{entries: []ovsctl.CTEntry{
		entry(17, vip, 53, live.IP, 5353),                    // to a serving endpoint: stays
		entry(17, vip, 53, gone, 5353),                       // to an endpoint gone: flushed
		entry(17, vip, 53, vip, 53),                          // never translated: flushed
		entry(6, vip, 53, gone, 5353),                        // TCP: stays
		entry(17, net.ParseIP("10.96.0.11"), 53, gone, 5353), // no frontend: stays
		entry(17, vip, 54, gone, 5353),                       // another port: stays
	}}
	udp := pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Endpoints: []pipeline.ServiceEndpoint{live}}
	p := &Proxier{cfg: Config{Conntrack: ct}, log: zaptest.NewLogger(t),
		installed: map[string]map[string]*portInstall{"ns/dns": {"ns/dns/dns/UDP": {port: udp, serving: udp.Endpoints}}}}
	if err := p.reconcileConntrack(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ct_nw_src=10.244.0.3,ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_src=40002,ct_tp_dst=53|",
		"ct_nw_src=10.244.0.3,ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_src=40003,ct_tp_dst=53|",
	}
	if strings.Join(ct.flushed, " ") != strings.Join(want, " ") {
		t.Errorf("flushed %v, want the two stale UDP connections %v", ct.flushed, want)
	}
}

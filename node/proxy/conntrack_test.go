package proxy

import (
	"fmt"
	"net"
	"strings"
	"testing"

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
	for _, tc := range []struct {
		name     string
		old, cur pipeline.ServicePort
		want     string
	}{
		{"unchanged", udp([]net.IP{vip}, ep(1), ep(2)), udp([]net.IP{vip}, ep(2), ep(1)), ""},
		{"an endpoint added", udp([]net.IP{vip}, ep(1)), udp([]net.IP{vip}, ep(1), ep(2)), ""},
		{"an endpoint gone", udp([]net.IP{vip}, ep(1), ep(2)), udp([]net.IP{vip}, ep(2)),
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"the target port changed", udp([]net.IP{vip}, ep(1)),
			udp([]net.IP{vip}, pipeline.ServiceEndpoint{IP: ep(1).IP, Port: 5354}),
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"a VIP gone", udp([]net.IP{vip, ext}, ep(1)), udp([]net.IP{vip}, ep(1)),
			"ct_nw_dst=198.18.5.5,ct_nw_proto=17,ct_tp_dst=53|"},
		{"the port removed", udp([]net.IP{vip}, ep(1)), pipeline.ServicePort{}, o10 + "|"},
		{"every endpoint gone: rejected now", udp([]net.IP{vip}, ep(1)),
			pipeline.ServicePort{Protocol: 17, Port: 53, VIPs: []net.IP{vip}, Action: pipeline.ServiceReject},
			o10 + "|ct_nw_src=10.244.1.1,ct_nw_proto=17,ct_tp_src=5353"},
		{"more endpoints gone than flushed one by one", udp([]net.IP{vip}, many(maxEndpointFlushes+1)...),
			udp([]net.IP{vip}), o10 + "|"},
		{"never installed", pipeline.ServicePort{}, udp([]net.IP{vip}, ep(1)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := show(staleConns(tc.old, tc.cur)); got != tc.want {
				t.Errorf("flushes %q, want %q", got, tc.want)
			}
		})
	}
}

package proxy

import "testing"

func TestFrontendName(t *testing.T) {
	for _, tc := range []struct{ key, port, kind string }{
		{"ns/web/http/TCP", "http/TCP", "internal"},
		{"ns/web/53/UDP/nodeport", "53/UDP", "nodeport"},
		{"ns/web/http/TCP/external/node", "http/TCP", "external/node"},
		{"ns/web/http/TCP/loadbalancer-pods", "http/TCP", "loadbalancer-pods"},
	} {
		if port, kind := frontendName("ns/web", tc.key); port != tc.port || kind != tc.kind {
			t.Errorf("%s: %q %q, want %q %q", tc.key, port, kind, tc.port, tc.kind)
		}
	}
}

package hostport

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/seine-net/seine/tests/netnstest"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Mapping
		err      string
	}{
		{name: "absent", in: ``},
		{name: "null", in: `null`},
		{name: "defaults", in: `[{"hostPort":8080,"containerPort":80}]`,
			want: []Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}},
		{name: "upper case and hostIP", in: `[{"hostPort":53,"containerPort":5353,"protocol":"UDP","hostIP":"198.18.0.11"}]`,
			want: []Mapping{{HostPort: 53, ContainerPort: 5353, Protocol: "udp", HostIP: "198.18.0.11"}}},
		{name: "any address", in: `[{"hostPort":1,"containerPort":2,"protocol":"sctp","hostIP":"0.0.0.0"}]`,
			want: []Mapping{{HostPort: 1, ContainerPort: 2, Protocol: "sctp"}}},
		{name: "IPv6 skipped", in: `[{"hostPort":80,"containerPort":80,"hostIP":"fd00::1"}]`, want: []Mapping{}},
		{name: "same port, two protocols", in: `[{"hostPort":53,"containerPort":53,"protocol":"tcp"},{"hostPort":53,"containerPort":53,"protocol":"udp"}]`,
			want: []Mapping{{HostPort: 53, ContainerPort: 53, Protocol: "tcp"}, {HostPort: 53, ContainerPort: 53, Protocol: "udp"}}},
		{name: "port zero", in: `[{"hostPort":0,"containerPort":80}]`, err: "portMappings[0]: hostPort 0"},
		{name: "port too large", in: `[{"hostPort":80,"containerPort":70000}]`, err: "containerPort 70000"},
		{name: "protocol", in: `[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]`, err: `protocol "icmp"`},
		{name: "hostIP", in: `[{"hostPort":80,"containerPort":80,"hostIP":"node-1"}]`, err: `hostIP "node-1"`},
		{name: "twice", in: `[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81,"protocol":"TCP"}]`, err: "portMappings[1]: tcp 0.0.0.0:80 -> 81 is listed twice"},
		{name: "not a list", in: `{"hostPort":80}`, err: "portMappings: json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(json.RawMessage(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 0 || len(tc.want) != 0 {
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("got %+v, want %+v", got, tc.want)
				}
			}
		})
	}
}

// TestMapperProgramsAndRelearns programs the table in a fresh namespace:
// mappings become map elements owned by their attachment, a host port
// another attachment holds is refused, a new Mapper (a restarted daemon)
// learns the mappings back from the table, and Unmap and Cleanup remove
// them.
func TestMapperProgramsAndRelearns(t *testing.T) {
	netnstest.Run(t, func() {
		ctx := context.Background()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "seine-gw0"}, PeerName: "seine-gw0-peer"}); err != nil {
			t.Fatal(err)
		}
		cfg := Config{Gateway: "seine-gw0"}
		nft, err := NewNFTables()
		if err != nil {
			t.Fatal(err)
		}
		m := New(nft, cfg)
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if v, err := os.ReadFile("/proc/sys/net/ipv4/conf/seine-gw0/route_localnet"); err != nil || strings.TrimSpace(string(v)) != "1" {
			t.Errorf("route_localnet = %q, %v", v, err)
		}
		a := []Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "198.18.0.11"}}
		if err := m.Map(ctx, "pod/c1/eth0", net.ParseIP("10.244.1.5"), a); err != nil {
			t.Fatal(err)
		}
		table := list(t)
		for _, want := range []string{
			`tcp . 8080 comment "pod/c1/eth0" : 10.244.1.5 . 80`,
			`198.18.0.11 . udp . 5353 comment "pod/c1/eth0" : 10.244.1.5 . 53`,
			`10.244.1.5 . tcp . 80 comment "pod/c1/eth0"`,
			`10.244.1.5 . udp . 53 comment "pod/c1/eth0"`,
			`dnat ip to meta l4proto . th dport map @ports`,
			`10.244.1.5 . 10.244.1.5 comment "pod/c1/eth0"`,
			// Masqueraded: localhost, and a Pod to its own hostPort;
			// other Pods keep their address for its policies.
			`oifname "seine-gw0" ip saddr 127.0.0.0/8 ct status dnat ip daddr . meta l4proto . th dport @targets masquerade`,
			`oifname "seine-gw0" ct status dnat ip saddr . ip daddr @self ip daddr . meta l4proto . th dport @targets masquerade`,
			// Only local addresses: a hostIP elsewhere maps nothing.
			"type nat hook prerouting priority dstnat; policy accept;\n\t\tfib daddr type local jump hostports",
			"type nat hook output priority -100; policy accept;\n\t\tfib daddr type local jump hostports",
			// route_localnet must not open the host's loopback to Pods.
			"type filter hook prerouting priority mangle; policy accept;\n\t\tiifname \"seine-gw0\" ip daddr 127.0.0.0/8 drop",
		} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}

		for _, mp := range []Mapping{
			{HostPort: 8080, ContainerPort: 8080, Protocol: "tcp"},
			{HostPort: 8080, ContainerPort: 8080, Protocol: "tcp", HostIP: "198.18.0.12"}, // c1 holds every address
			{HostPort: 5353, ContainerPort: 53, Protocol: "udp"},                          // c1 holds one address
		} {
			err := m.Map(ctx, "pod/c2/eth0", net.ParseIP("10.244.1.6"), []Mapping{mp})
			if err == nil || !strings.Contains(err.Error(), mp.String()+" is already mapped to attachment pod/c1/eth0") {
				t.Errorf("conflicting Map of %s: %v", mp, err)
			}
		}
		if err := m.Map(ctx, "pod/c2/eth0", net.ParseIP("10.244.1.6"), []Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "udp"},
			{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "198.18.0.12"}}); err != nil {
			t.Errorf("same port, other protocol or other address: %v", err)
		}

		// A restarted daemon: Start again keeps the elements and learns
		// them, gives a Pod mapped before the hairpin set existed its
		// element, and drops one an older daemon's DEL left behind.
		if out, err := exec.Command("nft", "delete", "element", "ip", TableName, "self", "{ 10.244.1.6 . 10.244.1.6 }").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if out, err := exec.Command("nft", "add", "element", "ip", TableName, "self",
			`{ 10.244.1.9 . 10.244.1.9 comment "pod/gone/eth0" }`).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		m2 := New(nft, cfg)
		if err := m2.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := m2.Owners(); !reflect.DeepEqual(got, []string{"pod/c1/eth0", "pod/c2/eth0"}) {
			t.Errorf("owners after restart = %v", got)
		}
		if table := list(t); !strings.Contains(table, `10.244.1.6 . 10.244.1.6 comment "pod/c2/eth0"`) || strings.Contains(table, "10.244.1.9") {
			t.Errorf("the restart did not restore c2's hairpin element, or kept the stale one:\n%s", table)
		}
		if err := m2.Map(ctx, "pod/c3/eth0", net.ParseIP("10.244.1.7"), []Mapping{{HostPort: 8080, ContainerPort: 1, Protocol: "tcp"}}); err == nil {
			t.Error("restarted Mapper accepted a taken host port")
		}
		// A repeated ADD replaces its own mappings.
		if err := m2.Map(ctx, "pod/c1/eth0", net.ParseIP("10.244.1.5"), []Mapping{{HostPort: 8081, ContainerPort: 80, Protocol: "tcp"}}); err != nil {
			t.Fatal(err)
		}
		if table := list(t); strings.Contains(table, "8080 comment \"pod/c1") || strings.Contains(table, "udp . 53 comment \"pod/c1") || !strings.Contains(table, "8081") {
			t.Errorf("after replacing c1's mappings:\n%s", table)
		}
		if err := m2.Unmap(ctx, "pod/c1/eth0"); err != nil {
			t.Fatal(err)
		}
		if err := m2.Unmap(ctx, "pod/none/eth0"); err != nil {
			t.Errorf("Unmap of an owner without mappings: %v", err)
		}
		if table := list(t); strings.Contains(table, "pod/c1/eth0") || !strings.Contains(table, "pod/c2/eth0") {
			t.Errorf("after Unmap of c1:\n%s", table)
		}
		// An element removed behind its back does not keep the others.
		if out, err := exec.Command("nft", "delete", "element", "ip", TableName, "ports", "{ udp . 8080 }").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if err := m2.Map(ctx, "pod/c2/eth0", net.ParseIP("10.244.1.6"), []Mapping{{HostPort: 8080, ContainerPort: 80, Protocol: "udp"}, {HostPort: 9090, ContainerPort: 90, Protocol: "tcp"}}); err != nil {
			t.Errorf("repeated Map after an outside delete: %v", err)
		}
		if table := list(t); !strings.Contains(table, `udp . 8080 comment "pod/c2/eth0"`) || !strings.Contains(table, "9090") {
			t.Errorf("after the repeated Map:\n%s", table)
		}
		if err := m2.Unmap(ctx, "pod/c2/eth0"); err != nil {
			t.Errorf("Unmap with an element already gone: %v", err)
		}
		if table := list(t); strings.Contains(table, "pod/c2/eth0") {
			t.Errorf("c2's elements left:\n%s", table)
		}
		if err := Cleanup(ctx, nft); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nft", "list", "table", "ip", TableName).CombinedOutput(); err == nil {
			t.Errorf("table left after Cleanup:\n%s", out)
		}
	})
}

func list(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "ip", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return string(out)
}

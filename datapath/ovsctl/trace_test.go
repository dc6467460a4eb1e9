package ovsctl

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The testdata traces were captured from a seine sandbox Node's
// ovs-vswitchd (userspace datapath, geneve tunnel): allowed ones with the
// pipeline as installed, denied ones after adding a drop flow to the
// IngressDefault (100) or EgressDefault (60) table.
func TestParseTraceCaptured(t *testing.T) {
	cases := map[string]bool{
		"trace-same-node-allowed.txt":       true, // "...,ct(commit,zone=65520),7"
		"trace-cross-egress-allowed.txt":    true, // tnl_push(...),2
		"trace-cross-egress-neigh-miss.txt": true, // pipeline outputs to the tunnel, ARP pending
		"trace-cross-ingress-allowed.txt":   true,
		"trace-cross-ingress-denied.txt":    false,
		"trace-cross-egress-denied.txt":     false,
	}
	for f, want := range cases {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := ParseTrace(string(b))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if got := tr.Output; got != want {
			t.Errorf("%s: allowed=%v, want %v", f, got, want)
		}
	}
}

func TestParseTraceSynthetic(t *testing.T) {
	cases := []struct {
		text string
		want bool
		err  bool
	}{
		{"Datapath actions: drop\n", false, false},
		{"Datapath actions: set(eth(src=06:00:1c:ea:43:de)),set(ipv4(ttl=63)),ct(commit,zone=65520)\n", false, false},
		{"Datapath actions: output:3\n", true, false},
		{"Datapath actions: clone(tnl_push(tnl_port(4),header(size=50),out_port(1)),2)\n", true, false},
		// Only the section after the last recirculation counts.
		{"Datapath actions: ct(zone=65520,nat),recirc(0x1)\n\n=====\nrecirc(0x1)\n=====\nDatapath actions: drop\n", false, false},
		{"Datapath actions: ct(zone=65520,nat),recirc(0x1)\n", false, true},
		{"Bad openflow flow syntax\n", false, true},
		{"Datapath actions: userspace(pid=0,controller(reason=2))\n", false, false},
	}
	for i, c := range cases {
		tr, err := ParseTrace(c.text)
		if got := tr.Output; (err != nil) != c.err || got != c.want {
			t.Errorf("case %d: got %v, %v; want %v, error %v", i, got, err, c.want, c.err)
		}
	}
}

// The tables come from every section, in order.
func TestParseTraceTables(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "trace-cross-ingress-denied.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ParseTrace(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Tables) < 5 || !slices.Equal(tr.Tables[:5], []uint8{0, 30, 31, 50, 60}) || tr.Tables[len(tr.Tables)-1] != 100 {
		t.Fatalf("tables %v", tr.Tables)
	}
}

// A trace into a native tunnel continues in the transport bridge; only the
// tables of the bridge traced count.
func TestParseTraceTablesStayInTheBridge(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "trace-cross-egress-allowed.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ParseTrace(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Tables) == 0 || tr.Tables[0] != 0 || tr.Tables[len(tr.Tables)-1] != 120 {
		t.Fatalf("tables %v: want br-int's, from 0 to 120", tr.Tables)
	}
}

package ovsctl

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/seine-net/seine/datapath/ovstest"
)

func TestRunAndPurge(t *testing.T) {
	o := ovstest.Start(t)
	c := New(o.RunDir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.Run(ctx, "version")
	if err != nil || !strings.Contains(out, "ovs-vswitchd") {
		t.Fatalf("version: %q, %v", out, err)
	}
	if err := c.PurgeDatapathFlows(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, "no/such-command"); err == nil {
		t.Fatal("unknown command accepted")
	}
	if _, err := New(t.TempDir()).Run(ctx, "version"); err == nil {
		t.Fatal("missing daemon not reported")
	}
}

func TestCTTupleString(t *testing.T) {
	for _, tc := range []struct {
		tu   CTTuple
		want string
	}{
		{CTTuple{}, ""},
		{CTTuple{Dst: net.ParseIP("10.96.0.10"), Proto: 17, DstPort: 53}, "ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_dst=53"},
		{CTTuple{Src: net.ParseIP("10.244.1.5"), Proto: 132, SrcPort: 5353}, "ct_nw_src=10.244.1.5,ct_nw_proto=132,ct_tp_src=5353"},
	} {
		if got := tc.tu.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.tu, got, tc.want)
		}
	}
}

// FlushConntrack removes exactly the entries its partial tuples match,
// from a real userspace datapath's connection tracker: UDP datagrams from
// one namespace to another through a netdev bridge commit two entries,
// and flushing one destination port leaves the other.
func TestFlushConntrack(t *testing.T) {
	o := ovstest.Start(t)
	c := New(o.RunDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	suffix := strconv.Itoa(os.Getpid() % 100000)
	nsA, nsB := "seine-cta-"+suffix, "seine-ctb-"+suffix
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	o.Run("ovs-vsctl", "add-br", "brct", "--", "set", "bridge", "brct", "datapath_type=netdev")
	for i, n := range []string{nsA, nsB} {
		host := fmt.Sprintf("ctv%d-%s", i, suffix)
		t.Cleanup(func() {
			_ = exec.Command("ip", "link", "del", host).Run()
			_ = exec.Command("ip", "netns", "del", n).Run()
		})
		sh("ip", "netns", "add", n)
		sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", n)
		sh("ip", "link", "set", host, "up")
		sh("ip", "-n", n, "addr", "add", fmt.Sprintf("10.244.250.%d/24", i+1), "dev", "eth0")
		sh("ip", "-n", n, "link", "set", "eth0", "up")
		// The userspace connection tracker takes a datagram with a
		// checksum left to offload for invalid, and commits nothing.
		sh("ip", "netns", "exec", n, "ethtool", "-K", "eth0", "tx", "off")
		o.Run("ovs-vsctl", "add-port", "brct", host)
	}
	o.Run("ovs-ofctl", "add-flow", "brct", "priority=10,udp,actions=ct(commit,zone=65520),normal")
	o.Run("ovs-ofctl", "add-flow", "brct", "priority=0,actions=normal")
	dst := net.ParseIP("10.244.250.2")
	dump := func() string {
		t.Helper()
		out, err := c.Run(ctx, "dpctl/dump-conntrack", "netdev@ovs-netdev", "zone=65520")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Datagrams to two ports, resent until both entries show (the first
	// waits for ARP).
	err := ns.WithNetNSPath("/run/netns/"+nsA, func(ns.NetNS) error {
		conns := map[int]*net.UDPConn{}
		for _, port := range []int{5353, 5354} {
			conn, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: dst, Port: port})
			if err != nil {
				return err
			}
			defer conn.Close()
			conns[port] = conn
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			for _, conn := range conns {
				_, _ = conn.Write([]byte("x"))
			}
			d := dump()
			if strings.Contains(d, "dport=5353") && strings.Contains(d, "dport=5354") {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no conntrack entries for both ports; dump:\n%s", d)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := c.DumpConntrack(ctx, 65520)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[uint16]bool{}
	for _, e := range entries {
		if e.Zone == 65520 && e.Orig.Proto == 17 && e.Orig.Dst.Equal(dst) && e.Reply.Src.Equal(dst) {
			ports[e.Orig.DstPort] = true
		}
	}
	if !ports[5353] || !ports[5354] {
		t.Errorf("DumpConntrack: %+v, want the entries to ports 5353 and 5354", entries)
	}
	if err := c.FlushConntrack(ctx, 65520,
		CTTuple{Dst: dst, Proto: 17, DstPort: 5353}, CTTuple{Src: dst, Proto: 17, SrcPort: 5353}); err != nil {
		t.Fatal(err)
	}
	if d := dump(); strings.Contains(d, "dport=5353") || !strings.Contains(d, "dport=5354") {
		t.Errorf("after flushing port 5353, want only the 5354 entry left:\n%s", d)
	}
	// A reply tuple that matches nothing of the entry's flushes nothing.
	if err := c.FlushConntrack(ctx, 65520,
		CTTuple{Dst: dst, Proto: 17, DstPort: 5354}, CTTuple{Src: net.ParseIP("10.244.250.9")}); err != nil {
		t.Fatal(err)
	}
	if d := dump(); !strings.Contains(d, "dport=5354") {
		t.Errorf("a flush whose reply tuple differs removed the entry:\n%s", d)
	}
	if err := c.FlushConntrack(ctx, 65520, CTTuple{}, CTTuple{}); err == nil {
		t.Error("a flush of the whole zone was accepted")
	}
}

func TestParseConntrack(t *testing.T) {
	out := strings.Join([]string{
		"udp,orig=(src=10.244.0.3,dst=10.96.0.10,sport=40000,dport=53),reply=(src=10.244.1.5,dst=10.244.0.3,sport=5353,dport=40000),zone=65520,mark=1",
		"icmp,orig=(src=10.244.0.3,dst=10.244.1.5,id=7,type=8,code=0),reply=(src=10.244.1.5,dst=10.244.0.3,id=7,type=0,code=0),zone=65520",
		"udp,orig=(src=fd00::1,dst=fd00::2,sport=1,dport=2),reply=(src=fd00::2,dst=fd00::1,sport=2,dport=1),zone=65520",
		"tcp,orig=(src=10.244.0.3,dst=10.96.0.1,sport=5000,dport=443),reply=(src=198.18.0.1,dst=10.244.0.3,sport=6443,dport=5000),zone=65520,protoinfo=(state=ESTABLISHED)",
		"",
	}, "\n")
	got, err := ParseConntrack(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d entries, want the UDP and TCP IPv4 ones: %+v", len(got), got)
	}
	u := got[0]
	if u.Zone != 65520 || u.Orig.String() != "ct_nw_src=10.244.0.3,ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_src=40000,ct_tp_dst=53" ||
		u.Reply.String() != "ct_nw_src=10.244.1.5,ct_nw_dst=10.244.0.3,ct_nw_proto=17,ct_tp_src=5353,ct_tp_dst=40000" {
		t.Errorf("UDP entry %+v", u)
	}
	if got[1].Orig.Proto != 6 || got[1].Reply.SrcPort != 6443 {
		t.Errorf("TCP entry %+v", got[1])
	}
	if _, err := ParseConntrack("udp,orig=(src=10.244.0.3,dst=10.96.0.10,sport=x,dport=53),reply=(src=1.1.1.1,dst=2.2.2.2,sport=1,dport=2)"); err == nil {
		t.Error("a malformed entry parsed")
	}
}

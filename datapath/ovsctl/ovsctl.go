// Package ovsctl talks to ovs-vswitchd's control socket (the unixctl
// JSON-RPC interface that ovs-appctl uses, ovs-appctl(8)), for the few
// operations that have no OpenFlow or OVSDB equivalent.
package ovsctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
)

// Client sends commands to one ovs-vswitchd.
type Client struct {
	runDir string
	id     atomic.Uint64
}

// New returns a client for the ovs-vswitchd whose control socket is in
// runDir: "ovs-vswitchd.ctl" when the daemon was started with that
// --unixctl path, else "ovs-vswitchd.<pid>.ctl" with the pid from
// "ovs-vswitchd.pid" (the default naming, ovs-vswitchd(8)).
func New(runDir string) *Client { return &Client{runDir: runDir} }

func (c *Client) socket() (string, error) {
	p := filepath.Join(c.runDir, "ovs-vswitchd.ctl")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	b, err := os.ReadFile(filepath.Join(c.runDir, "ovs-vswitchd.pid"))
	if err != nil {
		return "", fmt.Errorf("finding the ovs-vswitchd control socket in %s: %w", c.runDir, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("ovs-vswitchd pidfile: %w", err)
	}
	return filepath.Join(c.runDir, fmt.Sprintf("ovs-vswitchd.%d.ctl", pid)), nil
}

// Run executes one command (e.g. "revalidator/purge") and returns its
// output. An error reply from the daemon is returned as an error.
func (c *Client) Run(ctx context.Context, method string, params ...string) (string, error) {
	sock, err := c.socket()
	if err != nil {
		return "", err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", sock, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if params == nil {
		params = []string{}
	}
	id := c.id.Add(1)
	if err := json.NewEncoder(conn).Encode(map[string]any{"method": method, "params": params, "id": id}); err != nil {
		return "", fmt.Errorf("sending %s: %w", method, err)
	}
	var reply struct {
		Result *string          `json:"result"`
		Error  *json.RawMessage `json:"error"`
	}
	if err := json.NewDecoder(conn).Decode(&reply); err != nil {
		return "", fmt.Errorf("reading the reply to %s: %w", method, err)
	}
	if reply.Error != nil && string(*reply.Error) != "null" {
		return "", fmt.Errorf("ovs-vswitchd %s: %s", method, string(*reply.Error))
	}
	if reply.Result == nil {
		return "", errors.New("ovs-vswitchd sent an empty reply to " + method)
	}
	return *reply.Result, nil
}

// PurgeDatapathFlows drops every cached datapath flow (megaflow) so the
// next packets are classified against the current OpenFlow tables
// ("revalidator/purge"). Seine does this after NetworkPolicy changes that
// revoke access: with the userspace datapath, OVS 3.1 was seen to keep
// serving an allowing megaflow after the OpenFlow tables had turned to
// deny.
func (c *Client) PurgeDatapathFlows(ctx context.Context) error {
	_, err := c.Run(ctx, "revalidator/purge")
	return err
}

// CTTuple is one direction of a conntrack entry to match, as
// "dpctl/flush-conntrack" (ovs-vswitchd(8)) and "ct-flush" (ovs-ofctl(8))
// take it. A zero field matches any value, so the tuple may be partial
// (OVS 3.1 and later).
type CTTuple struct {
	// Src and Dst are IPv4 addresses; nil matches any.
	Src, Dst net.IP
	// Proto is the IP protocol number (6 TCP, 17 UDP, 132 SCTP); 0 any.
	Proto uint8
	// SrcPort and DstPort are the transport ports; 0 any.
	SrcPort, DstPort uint16
}

// String is the tuple in OVS's syntax: "ct_nw_dst=10.96.0.10,ct_nw_proto=17,ct_tp_dst=53".
func (t CTTuple) String() string {
	var f []string
	if t.Src != nil {
		f = append(f, "ct_nw_src="+t.Src.String())
	}
	if t.Dst != nil {
		f = append(f, "ct_nw_dst="+t.Dst.String())
	}
	if t.Proto != 0 {
		f = append(f, "ct_nw_proto="+strconv.Itoa(int(t.Proto)))
	}
	if t.SrcPort != 0 {
		f = append(f, "ct_tp_src="+strconv.Itoa(int(t.SrcPort)))
	}
	if t.DstPort != 0 {
		f = append(f, "ct_tp_dst="+strconv.Itoa(int(t.DstPort)))
	}
	return strings.Join(f, ",")
}

// FlushConntrack removes the connections of conntrack zone zone whose
// original direction matches orig and whose reply direction matches reply
// ("dpctl/flush-conntrack", ovs-vswitchd(8)), in the one datapath of the
// ovs-vswitchd (OVS 3.1 takes no datapath name alongside tuples). The
// userspace connection tracker matches the original direction as it was
// before NAT, which is what orig should give. An empty orig and reply
// would flush the whole zone, and is refused.
func (c *Client) FlushConntrack(ctx context.Context, zone uint16, orig, reply CTTuple) error {
	o, r := orig.String(), reply.String()
	if o == "" && r == "" {
		return errors.New("flushing conntrack: no tuple given (that would flush the whole zone)")
	}
	params := []string{"zone=" + strconv.Itoa(int(zone)), o}
	if r != "" {
		params = append(params, r)
	}
	if _, err := c.Run(ctx, "dpctl/flush-conntrack", params...); err != nil {
		return fmt.Errorf("flushing conntrack zone %d (%s | %s): %w", zone, o, r, err)
	}
	return nil
}

// CTEntry is one connection of a conntrack dump: the tuples of its two
// directions (each with Proto set) and its zone.
type CTEntry struct {
	Orig, Reply CTTuple
	Zone        uint16
}

// DumpConntrack lists the UDP, TCP and SCTP connections of conntrack
// zone zone ("dpctl/dump-conntrack", ovs-vswitchd(8)), in the one
// datapath of the ovs-vswitchd. Other protocols are left out.
func (c *Client) DumpConntrack(ctx context.Context, zone uint16) ([]CTEntry, error) {
	out, err := c.Run(ctx, "dpctl/dump-conntrack", "zone="+strconv.Itoa(int(zone)))
	if err != nil {
		return nil, fmt.Errorf("dumping conntrack zone %d: %w", zone, err)
	}
	return ParseConntrack(out)
}

// ctProtos are the protocols ParseConntrack keeps, by dump name.
var ctProtos = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

// ParseConntrack reads the lines of a conntrack dump, such as
// "udp,orig=(src=10.244.0.3,dst=10.96.0.10,sport=40000,dport=53),reply=(src=10.244.1.5,dst=10.244.0.3,sport=5353,dport=40000),zone=65520".
// Lines of other protocols (icmp, ...) and of IPv6 connections are
// skipped; a malformed UDP, TCP or SCTP line is an error naming it.
func ParseConntrack(out string) ([]CTEntry, error) {
	var entries []CTEntry
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		proto, rest, _ := strings.Cut(line, ",")
		p, ok := ctProtos[proto]
		if !ok {
			continue
		}
		e := CTEntry{}
		var err error
		if e.Orig, rest, err = ctDirection(rest, "orig=(", p); err == nil {
			e.Reply, rest, err = ctDirection(strings.TrimPrefix(rest, ","), "reply=(", p)
		}
		if errors.Is(err, errNotIPv4) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("conntrack entry %q: %w", line, err)
		}
		for _, f := range strings.Split(rest, ",") {
			if z, ok := strings.CutPrefix(f, "zone="); ok {
				n, err := strconv.ParseUint(z, 10, 16)
				if err != nil {
					return nil, fmt.Errorf("conntrack entry %q: zone: %w", line, err)
				}
				e.Zone = uint16(n)
			}
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// errNotIPv4 marks a connection of IPv6 addresses.
var errNotIPv4 = errors.New("not IPv4")

// ctDirection parses "<prefix>src=A,dst=B,sport=C,dport=D)" at the start
// of s and returns the tuple and what follows it.
func ctDirection(s, prefix string, proto uint8) (CTTuple, string, error) {
	body, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return CTTuple{}, "", fmt.Errorf("want %q", prefix)
	}
	body, rest, ok := strings.Cut(body, ")")
	if !ok {
		return CTTuple{}, "", fmt.Errorf("%s not closed", prefix)
	}
	t := CTTuple{Proto: proto}
	for _, kv := range strings.Split(body, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "src", "dst":
			ip := net.ParseIP(v)
			if ip == nil {
				return CTTuple{}, "", fmt.Errorf("%s %q is not an IP address", k, v)
			}
			if ip = ip.To4(); ip == nil {
				return CTTuple{}, "", errNotIPv4
			}
			if k == "src" {
				t.Src = ip
			} else {
				t.Dst = ip
			}
		case "sport", "dport":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return CTTuple{}, "", fmt.Errorf("%s: %w", k, err)
			}
			if k == "sport" {
				t.SrcPort = uint16(n)
			} else {
				t.DstPort = uint16(n)
			}
		}
	}
	return t, rest, nil
}

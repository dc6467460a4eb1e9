package ovsctl

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Trace is what ofproto/trace (ovs-vswitchd(8)) says of a packet.
type Trace struct {
	// Tables are the OpenFlow tables the packet visited in the bridge the
	// trace started in, in order, over every conntrack recirculation the
	// trace followed (a native tunnel's output continues in another
	// bridge, whose tables are left out).
	Tables []uint8
	// Output is true when the pipeline sends the packet out of the bridge
	// (to a port or into a native tunnel).
	Output bool
	// DatapathActions are the datapath actions of the last section.
	DatapathActions string
}

// TraceFlow runs ofproto/trace for flow (ovs-ofctl(8) flow syntax) on
// bridge, following every conntrack recirculation as a new connection
// ("--ct-next trk,new"), and returns the trace text.
func (c *Client) TraceFlow(ctx context.Context, bridge, flow string) (string, error) {
	return c.Run(ctx, "ofproto/trace", bridge, flow, "--ct-next", "trk,new")
}

// Version returns the version of ovs-vswitchd, e.g. "3.1.0".
func (c *Client) Version(ctx context.Context) (string, error) {
	out, err := c.Run(ctx, "version")
	if err != nil {
		return "", err
	}
	// "ovs-vswitchd (Open vSwitch) 3.1.0"
	f := strings.Fields(strings.TrimSpace(strings.SplitN(out, "\n", 2)[0]))
	if len(f) == 0 {
		return "", fmt.Errorf("ovs-vswitchd version: empty answer")
	}
	return f[len(f)-1], nil
}

var (
	traceTableLine  = regexp.MustCompile(`^\s*(\d+)\. `)
	traceBridgeLine = regexp.MustCompile(`^\s*bridge\("([^"]+)"\)`)
)

// ParseTrace reads ofproto/trace output. The verdict comes from the
// "Datapath actions:" of the last section (after the last conntrack
// recirculation): a port (a bare datapath port number or output:N) or a
// native tunnel (tnl_push) means the packet leaves; "drop", or actions that
// only modify or commit the packet, mean it was dropped. A pipeline that
// outputs to the native tunnel while the tunnel's neighbour (ARP) entry is
// not resolved yet also counts as output: the pipeline's verdict is "send".
func ParseTrace(out string) (Trace, error) {
	var t Trace
	first, cur := "", ""
	for _, l := range strings.Split(out, "\n") {
		if m := traceBridgeLine.FindStringSubmatch(l); m != nil {
			cur = m[1]
			if first == "" {
				first = cur
			}
			continue
		}
		if m := traceTableLine.FindStringSubmatch(l); m != nil && cur == first {
			if n, err := strconv.ParseUint(m[1], 10, 8); err == nil {
				t.Tables = append(t.Tables, uint8(n))
			}
		}
	}
	last := out
	if i := strings.LastIndex(out, "\n======"); i >= 0 {
		// The last recirculation banner; the section after it is the last.
		last = out[i:]
	}
	line := ""
	for _, l := range strings.Split(last, "\n") {
		if strings.HasPrefix(l, "Datapath actions:") {
			line = strings.TrimSpace(strings.TrimPrefix(l, "Datapath actions:"))
		}
	}
	if line == "" {
		return t, errors.New("trace has no \"Datapath actions:\" line")
	}
	t.DatapathActions = line
	ok, err := actionsOutput(line)
	if err != nil {
		return t, err
	}
	t.Output = ok || (strings.Contains(last, "-> output to native tunnel") && strings.Contains(last, "neighbor cache miss"))
	return t, nil
}

// actionsOutput reports whether a datapath action list sends the packet.
func actionsOutput(line string) (bool, error) {
	if line == "drop" {
		return false, nil
	}
	for _, a := range splitTopLevel(line) {
		switch {
		case isDigits(a), strings.HasPrefix(a, "output:"), strings.HasPrefix(a, "tnl_push("):
			return true, nil
		case strings.HasPrefix(a, "clone(") && strings.HasSuffix(a, ")"):
			if inner, err := actionsOutput(strings.TrimSuffix(strings.TrimPrefix(a, "clone("), ")")); err == nil && inner {
				return true, nil
			}
		case strings.HasPrefix(a, "recirc("):
			return false, fmt.Errorf("trace ends in an unfollowed recirculation: %s", line)
		}
	}
	return false, nil
}

// splitTopLevel splits a datapath action list at commas outside
// parentheses.
func splitTopLevel(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// Command tcprr measures TCP request/response latency, as sockperf's
// ping-pong and netperf's TCP_RR do: one connection, one small message at
// a time, each echoed back before the next is sent.
//
//	tcprr -listen 0.0.0.0:5301                       # server: echoes every message
//	tcprr -connect 10.244.1.5:5301 -duration 5s      # client: prints one JSON line
//
// The client reports the number of round trips and the 50th and 99th
// percentiles and mean of the latency, in microseconds. Like sockperf, it
// reports latency as half a round trip. The first warmup of the run is not
// counted. Messages are -size bytes (default 64).
//
// With -crr the client opens a new connection for every round trip and
// closes it after (netperf's TCP_CRR): the latency is then the whole
// exchange (handshake, message, echo and the client's close), not halved,
// and the line also gives connections per second. This is the load that
// costs a flow-based switch the most: every connection is a new 5-tuple.
//
// With -against the client measures two paths in the same seconds: it
// opens a second connection, to the server at -against (from the network
// namespace -against-netns, a path such as /run/netns/NAME, when given),
// and takes one round trip on each connection in turn. The line then also
// holds the second path's figures ("against") and the ratio of the two
// medians ("p50Ratio", first path over second). Two paths measured this
// way share every moment of the machine's background, which on a busy or
// virtual machine moves a median by more than the difference between
// paths measured seconds apart.
//
//	tcprr -connect 10.244.0.2:5301 -against 10.0.0.2:5301 -against-netns /run/netns/bare-c
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	connect := flag.String("connect", "", "measure against the server at this address")
	duration := flag.Duration("duration", 5*time.Second, "measuring time")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "round trips not counted at the start")
	size := flag.Int("size", 64, "message size in bytes")
	once := flag.Bool("once", false, "server: exit after the first connection ends")
	crr := flag.Bool("crr", false, "client: a new connection for every round trip")
	against := flag.String("against", "", "client: also measure against this server, one round trip on each in turn")
	againstNetns := flag.String("against-netns", "", "with -against: the network namespace (a path) to connect from")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen, *size, *once)
	case *connect != "":
		switch {
		case *against != "" && *crr:
			err = errors.New("-against measures one connection per server; it does not combine with -crr")
		case *against != "":
			var r Result
			if r, err = measurePair(*connect, *against, *againstNetns, *size, *warmup, *duration); err == nil {
				err = json.NewEncoder(os.Stdout).Encode(r)
			}
		case *crr:
			err = measureCRR(*connect, *size, *warmup, *duration)
		default:
			err = measure(*connect, *size, *warmup, *duration)
		}
	default:
		err = errors.New("give -listen or -connect")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcprr:", err)
		os.Exit(1)
	}
}

func serve(addr string, size int, once bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return echo(l, size, once)
}

// echo echoes every size-byte message on each connection l accepts, until
// l fails (or, with once, the first connection ends); it closes l.
func echo(l net.Listener, size int, once bool) error {
	defer l.Close()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer c.Close()
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		if once {
			<-done
			return nil
		}
	}
}

// Result is what the client prints.
type Result struct {
	RoundTrips int     `json:"roundTrips"`
	P50Micros  float64 `json:"p50us"`
	P99Micros  float64 `json:"p99us"`
	MeanMicros float64 `json:"meanus"`
	// ConnsPerSecond is set with -crr: connections completed per second of
	// the measuring time.
	ConnsPerSecond float64 `json:"connsPerSecond,omitempty"`
	// Against is the second path's figures, with -against.
	Against *Result `json:"against,omitempty"`
	// P50Ratio is P50Micros over Against.P50Micros, with -against.
	P50Ratio float64 `json:"p50Ratio,omitempty"`
}

func measure(addr string, size int, warmup, duration time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, size)
	lat, err := timeRoundTrips(warmup, duration, func() error { return roundTrip(c, buf) })
	if err != nil {
		return err
	}
	return report(lat, 2, 0)
}

// roundTrip sends buf on c and reads its echo back into buf.
func roundTrip(c net.Conn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

// measurePair is measure on two connections at once, to addr from the
// current network namespace and to other from otherNetns (the current one
// when empty), one round trip on each in turn, so that both paths are
// measured under the same background. It returns addr's figures with
// other's in Against.
func measurePair(addr, other, otherNetns string, size int, warmup, duration time.Duration) (Result, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	var d net.Conn
	dial := func(ns.NetNS) error {
		var err error
		d, err = net.DialTimeout("tcp", other, 5*time.Second)
		return err
	}
	if otherNetns == "" {
		err = dial(nil)
	} else {
		err = ns.WithNetNSPath(otherNetns, dial)
	}
	if err != nil {
		return Result{}, fmt.Errorf("-against %s: %w", other, err)
	}
	defer d.Close()
	buf := make([]byte, size)
	var first, second []time.Duration
	start := time.Now()
	for {
		elapsed := time.Since(start)
		if elapsed > warmup+duration {
			break
		}
		t0 := time.Now()
		if err := roundTrip(c, buf); err != nil {
			return Result{}, err
		}
		t1 := time.Now()
		if err := roundTrip(d, buf); err != nil {
			return Result{}, fmt.Errorf("-against %s: %w", other, err)
		}
		if elapsed >= warmup {
			first, second = append(first, t1.Sub(t0)), append(second, time.Since(t1))
		}
	}
	r, err := summarize(first, 2)
	if err != nil {
		return Result{}, err
	}
	o, err := summarize(second, 2)
	if err != nil {
		return Result{}, err
	}
	r.Against, r.P50Ratio = &o, r.P50Micros/o.P50Micros
	return r, nil
}

// measureCRR is measure with a new connection per round trip. A failed
// connection ends the run with its error: a switch that drops the first
// packet of some connections must not look fast.
func measureCRR(addr string, size int, warmup, duration time.Duration) error {
	buf := make([]byte, size)
	lat, err := timeRoundTrips(warmup, duration, func() error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		return roundTrip(c, buf)
	})
	if err != nil {
		return err
	}
	return report(lat, 1, float64(len(lat))/duration.Seconds())
}

// timeRoundTrips calls rt, one call after another, until warmup+duration
// has passed, and returns how long each call that started after warmup
// took. The first error ends it.
func timeRoundTrips(warmup, duration time.Duration, rt func() error) ([]time.Duration, error) {
	var lat []time.Duration
	start := time.Now()
	for {
		t0 := time.Now()
		if t0.Sub(start) > warmup+duration {
			return lat, nil
		}
		if err := rt(); err != nil {
			return nil, err
		}
		if t0.Sub(start) >= warmup {
			lat = append(lat, time.Since(t0))
		}
	}
}

// report prints the percentiles of lat, each divided by div (2 gives half
// a round trip), in microseconds.
func report(lat []time.Duration, div float64, connsPerSecond float64) error {
	r, err := summarize(lat, div)
	if err != nil {
		return err
	}
	r.ConnsPerSecond = connsPerSecond
	return json.NewEncoder(os.Stdout).Encode(r)
}

// summarize gives the percentiles and mean of lat, each divided by div,
// in microseconds; it sorts lat.
func summarize(lat []time.Duration, div float64) (Result, error) {
	if len(lat) == 0 {
		return Result{}, errors.New("no round trip completed")
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	half := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / div }
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return Result{
		RoundTrips: len(lat),
		P50Micros:  half(pct(0.50)),
		P99Micros:  half(pct(0.99)),
		MeanMicros: half(sum / time.Duration(len(lat))),
	}, nil
}

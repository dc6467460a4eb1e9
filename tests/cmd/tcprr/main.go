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
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	connect := flag.String("connect", "", "measure against the server at this address")
	duration := flag.Duration("duration", 5*time.Second, "measuring time")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "round trips not counted at the start")
	size := flag.Int("size", 64, "message size in bytes")
	once := flag.Bool("once", false, "server: exit after the first connection ends")
	crr := flag.Bool("crr", false, "client: a new connection for every round trip")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen, *size, *once)
	case *connect != "":
		if *crr {
			err = measureCRR(*connect, *size, *warmup, *duration)
		} else {
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
}

func measure(addr string, size int, warmup, duration time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, size)
	lat, err := timeRoundTrips(warmup, duration, func() error {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	})
	if err != nil {
		return err
	}
	return report(lat, 2, 0)
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
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err = io.ReadFull(c, buf)
		return err
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
	if len(lat) == 0 {
		return errors.New("no round trip completed")
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	half := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / div }
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return json.NewEncoder(os.Stdout).Encode(Result{
		RoundTrips:     len(lat),
		P50Micros:      half(pct(0.50)),
		P99Micros:      half(pct(0.99)),
		MeanMicros:     half(sum / time.Duration(len(lat))),
		ConnsPerSecond: connsPerSecond,
	})
}

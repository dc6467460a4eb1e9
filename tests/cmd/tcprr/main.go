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
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen, *size, *once)
	case *connect != "":
		err = measure(*connect, *size, *warmup, *duration)
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
}

func measure(addr string, size int, warmup, duration time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, size)
	var lat []time.Duration
	start := time.Now()
	for {
		t0 := time.Now()
		if t0.Sub(start) > warmup+duration {
			break
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if t0.Sub(start) >= warmup {
			lat = append(lat, time.Since(t0))
		}
	}
	if len(lat) == 0 {
		return errors.New("no round trip completed")
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	half := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 2000 }
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return json.NewEncoder(os.Stdout).Encode(Result{
		RoundTrips: len(lat),
		P50Micros:  half(pct(0.50)),
		P99Micros:  half(pct(0.99)),
		MeanMicros: half(sum / time.Duration(len(lat))),
	})
}

package main

import (
	"net"
	"testing"
	"time"
)

// echoServer serves tcprr's echo on a loopback port until the test ends
// and returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() { _ = echo(l, 64, false) }()
	return l.Addr().String()
}

func TestMeasurePair(t *testing.T) {
	a, z := echoServer(t), echoServer(t)
	r, err := measurePair(a, z, "", 64, 20*time.Millisecond, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.RoundTrips == 0 || r.Against == nil || r.Against.RoundTrips != r.RoundTrips {
		t.Fatalf("round trips: %d against %+v; want the same non-zero count on both paths", r.RoundTrips, r.Against)
	}
	if r.P50Micros <= 0 || r.Against.P50Micros <= 0 || r.P50Ratio != r.P50Micros/r.Against.P50Micros {
		t.Fatalf("p50 %v against %v, ratio %v", r.P50Micros, r.Against.P50Micros, r.P50Ratio)
	}
	if _, err := measurePair(a, "127.0.0.1:1", "", 64, 0, 50*time.Millisecond); err == nil {
		t.Fatal("a server that does not answer: no error")
	}
	if _, err := measurePair(a, z, "/nonexistent/netns", 64, 0, 50*time.Millisecond); err == nil {
		t.Fatal("a network namespace that does not exist: no error")
	}
}

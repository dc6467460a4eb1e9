// Package logring keeps the daemon's most recent log output in memory, so
// that a support bundle holds the logs wherever the daemon's standard
// error goes (a container runtime, journald, a file).
package logring

import (
	"io"
	"sync"
)

// Ring is an io.Writer that keeps the last size bytes written (New's
// argument), cut at a
// line boundary when read. It is safe for concurrent use.
type Ring struct {
	mu   sync.Mutex
	buf  []byte
	size int
}

// New returns a ring keeping the last size bytes.
func New(size int) *Ring { return &Ring{size: size, buf: make([]byte, 0, size)} }

// Write appends p, dropping the oldest bytes beyond the ring's size.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(p) >= r.size {
		r.buf = append(r.buf[:0], p[len(p)-r.size:]...)
		return n, nil
	}
	if over := len(r.buf) + len(p) - r.size; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	r.buf = append(r.buf, p...)
	return n, nil
}

// Sync is a no-op (zapcore.WriteSyncer).
func (r *Ring) Sync() error { return nil }

// WriteTo writes the kept output to w, from the first whole line.
func (r *Ring) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	b := append([]byte(nil), r.buf...)
	full := len(r.buf) == r.size
	r.mu.Unlock()
	if full {
		for i, c := range b {
			if c == '\n' {
				b = b[i+1:]
				break
			}
		}
	}
	n, err := w.Write(b)
	return int64(n), err
}

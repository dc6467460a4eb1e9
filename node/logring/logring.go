// Package logring keeps the daemon's most recent log output in memory, so
// that a support bundle holds the logs wherever the daemon's standard
// error goes (a container runtime, journald, a file).
package logring

import (
	"io"
	"sync"
)

// Ring is an io.Writer that keeps the last size bytes written (New's
// argument), cut at a line boundary when read. It is safe for concurrent
// use. It is circular: a write copies only its own bytes, however full the
// ring is.
type Ring struct {
	mu  sync.Mutex
	buf []byte // len(buf) is the size
	w   int    // where the next byte goes
	n   int    // bytes held, at most len(buf); the oldest is at w-n (mod size)
}

// New returns a ring keeping the last size bytes.
func New(size int) *Ring { return &Ring{buf: make([]byte, max(size, 0))} }

// Write appends p, dropping the oldest bytes beyond the ring's size.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	size := len(r.buf)
	if size == 0 {
		return len(p), nil
	}
	q := p
	if len(q) >= size {
		q = q[len(q)-size:]
		r.w = 0
	}
	k := copy(r.buf[r.w:], q)
	copy(r.buf, q[k:])
	r.w = (r.w + len(q)) % size
	r.n = min(r.n+len(q), size)
	return len(p), nil
}

// Sync is a no-op (zapcore.WriteSyncer).
func (r *Ring) Sync() error { return nil }

// WriteTo writes the kept output to w, from the first whole line.
func (r *Ring) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	size := len(r.buf)
	b := make([]byte, 0, r.n)
	if start := r.w - r.n; start >= 0 {
		b = append(b, r.buf[start:r.w]...)
	} else { // the two segments: the oldest bytes at the end, then the start
		b = append(append(b, r.buf[size+start:]...), r.buf[:r.w]...)
	}
	full := r.n == size
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

package logring

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestRingKeepsTheLastWholeLines(t *testing.T) {
	r := New(64)
	for i := 0; i < 100; i++ {
		fmt.Fprintf(r, "line %03d\n", i)
	}
	var b bytes.Buffer
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if !bytes.HasPrefix(b.Bytes(), []byte("line ")) || !bytes.HasSuffix(b.Bytes(), []byte("line 099\n")) || len(got) > 64 {
		t.Fatalf("kept %q", got)
	}
	r = New(8)
	_, _ = r.Write([]byte("0123456789"))
	b.Reset()
	_, _ = r.WriteTo(&b)
	if b.Len() > 8 {
		t.Fatalf("kept %d bytes of an 8-byte ring", b.Len())
	}
}

// want is what a ring of size holds after all was written to it: the last
// size bytes, from the first whole line once it is full.
func want(all []byte, size int) []byte {
	if len(all) < size {
		return all
	}
	tail := all[len(all)-size:]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 {
		return tail[i+1:]
	}
	return tail
}

// After writes of every size, smaller and larger than the ring, that wrap
// it many times, the ring reads back the last bytes written, in order.
func TestRingWrapsInOrder(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{1, 7, 64, 1000} {
		r := New(size)
		var all []byte
		for i := 0; i < 500; i++ {
			p := make([]byte, rnd.IntN(3*size+2))
			for j := range p {
				p[j] = "abcdefgh\n"[rnd.IntN(9)]
			}
			if n, err := r.Write(p); n != len(p) || err != nil {
				t.Fatalf("size %d: Write = %d, %v", size, n, err)
			}
			all = append(all, p...)
			var b bytes.Buffer
			n, err := r.WriteTo(&b)
			if err != nil || int(n) != b.Len() {
				t.Fatalf("size %d: WriteTo = %d, %v", size, n, err)
			}
			if w := want(all, size); !bytes.Equal(b.Bytes(), w) {
				t.Fatalf("size %d, write %d (%d bytes, %d in all):\n got %q\nwant %q", size, i, len(p), len(all), b.Bytes(), w)
			}
		}
		if len(all) < 10*size {
			t.Fatalf("size %d: only %d bytes written, the ring did not wrap enough", size, len(all))
		}
	}
}

// A write to a full ring stores its own bytes and moves none of the others
// (the ring used to shift its whole content, 4 MiB in the daemon, at every
// log line).
func TestFullRingWriteTouchesOnlyItsBytes(t *testing.T) {
	r := New(1000)
	for i := 0; i < 300; i++ {
		fmt.Fprintf(r, "line %04d\n", i)
	}
	before := bytes.Clone(r.buf[:cap(r.buf)])
	p := []byte("new line\n")
	_, _ = r.Write(p)
	changed := 0
	for i, c := range r.buf[:cap(r.buf)] {
		if c != before[i] {
			changed++
		}
	}
	if changed > len(p) {
		t.Fatalf("a %d-byte write changed %d bytes of the ring's storage", len(p), changed)
	}
}

// BenchmarkRingFull writes log lines to a full ring of the daemon's size
// (node/cmd's recentLogSize).
func BenchmarkRingFull(b *testing.B) {
	r := New(4 << 20)
	line := []byte(`{"level":"info","ts":"2024-01-01T00:00:00.000Z","logger":"podnet","msg":"attached","pod":"default/web-0"}` + "\n")
	for i := 0; i < (4<<20)/len(line)+1; i++ {
		_, _ = r.Write(line)
	}
	b.SetBytes(int64(len(line)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, _ = r.Write(line)
	}
}

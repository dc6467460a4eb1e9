package logring

import (
	"bytes"
	"fmt"
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

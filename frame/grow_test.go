package frame

import (
	"bytes"
	"io"
	"testing"
)

// TestReadPayloadGrowsAsBytesArrive: a header announcing 16 MiB followed by
// 100 bytes commits a small buffer, not megabytes, and a payload that does
// arrive in full is read whole.
func TestReadPayloadGrowsAsBytesArrive(t *testing.T) {
	h := Header{Type: TypeRequest, ID: 1, PayloadLen: 16 << 20}
	in := h.Append(nil)
	in = append(in, bytes.Repeat([]byte{7}, 100)...)
	r := NewReader(bytes.NewReader(in), 0)
	hh, err := r.ReadHeader()
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadPayload(&hh, nil)
	if err == nil {
		t.Fatal("want truncated")
	}
	if len(got) != 0 && len(got) != 100 || cap(got) > 2*minGrow {
		t.Fatalf("100 bytes of a 16 MiB payload committed %d bytes (len %d)", cap(got), len(got))
	}
	// A complete 3 MiB payload: read whole, with at most about twice its size committed.
	big := bytes.Repeat([]byte("abcdefgh"), 3<<17)
	h = Header{Type: TypeRequest, ID: 1, PayloadLen: uint32(len(big))}
	r = NewReader(bytes.NewReader(append(h.Append(nil), big...)), 0)
	hh, _ = r.ReadHeader()
	got, err = r.ReadPayload(&hh, nil)
	if err != nil || !bytes.Equal(got, big) || cap(got) > 2*len(big)+minGrow {
		t.Fatalf("3 MiB payload: %v, len %d cap %d", err, len(got), cap(got))
	}
}

// TestSmallReaderGrow: a small reader reads across its buffer size, and
// Grow swaps in the full buffer only when nothing is buffered.
func TestSmallReaderGrow(t *testing.T) {
	var in []byte
	for i := 0; i < 50; i++ {
		h := Header{Type: TypeRequest, ID: uint32(i + 1), PayloadLen: 300}
		in = append(h.Append(in), bytes.Repeat([]byte{byte(i)}, 300)...)
	}
	r := NewSmallReader(bytes.NewReader(in), 64, 64<<10)
	if r.Size() != 64 {
		t.Fatalf("size %d", r.Size())
	}
	grown := false
	for i := 0; i < 50; i++ {
		h, err := r.ReadHeader()
		if err != nil {
			t.Fatal(err)
		}
		if i == 10 && r.Grow() {
			t.Fatal("Grow with bytes buffered")
		}
		p, err := r.ReadPayload(&h, nil)
		if err != nil || len(p) != 300 || p[0] != byte(i) || h.ID != uint32(i+1) {
			t.Fatalf("frame %d: %v %d", i, err, len(p))
		}
		if i >= 20 && !grown && r.Buffered() == 0 {
			if !r.Grow() || r.Size() != 64<<10 {
				t.Fatal("Grow with nothing buffered")
			}
			grown = true
		}
	}
	if !grown {
		t.Fatal("never found the buffer empty to grow it")
	}
	if _, err := r.ReadHeader(); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
}

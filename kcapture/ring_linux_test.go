package kcapture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// fakeRing is a ring buffer in ordinary memory laid out as the kernel maps
// one: a consumer word, a producer word, and the data area twice in a row
// (writes go to both copies, as the double mapping shows them).
type fakeRing struct {
	r    *ringReader
	prod uint64
}

func newFakeRing(size int) *fakeRing {
	r := &ringReader{fd: -1, epfd: -1, size: uint64(size), cons: make([]byte, 8), prod: make([]byte, 8+2*size)}
	r.data = r.prod[8:]
	return &fakeRing{r: r}
}

func (f *fakeRing) put(off uint64, b []byte) {
	for i, v := range b {
		o := (off + uint64(i)) & (f.r.size - 1)
		f.r.data[o] = v
		f.r.data[o+f.r.size] = v
	}
}

// add appends a record with header word hdr (its length bits are set from
// payload unless raw) and publishes it.
func (f *fakeRing) add(payload []byte, flags uint32) {
	var h [8]byte
	binary.NativeEndian.PutUint32(h[:], uint32(len(payload))|flags)
	f.put(f.prod, h[:])
	f.put(f.prod+8, payload)
	f.prod += (uint64(len(payload)) + 8 + 7) &^ 7
	binary.NativeEndian.PutUint64(f.r.prod, f.prod)
}

func (f *fakeRing) cons() uint64 { return binary.NativeEndian.Uint64(f.r.cons) }

func TestRingReaderRecords(t *testing.T) {
	f := newFakeRing(64)
	// Fill most of the ring, consume, then write records that wrap around
	// the end: they must come back contiguous.
	f.add(bytes.Repeat([]byte{1}, 20), 0) // 32 bytes with header and padding
	f.add(bytes.Repeat([]byte{2}, 5), 0)  // 16
	f.add([]byte("gone"), ringDiscard)    // 16, skipped
	for _, want := range [][]byte{bytes.Repeat([]byte{1}, 20), bytes.Repeat([]byte{2}, 5)} {
		rec, ok, err := f.r.next()
		if err != nil || !ok || !bytes.Equal(rec, want) {
			t.Fatalf("next = %q %v %v, want %q", rec, ok, err, want)
		}
	}
	if f.cons() != 0 {
		t.Fatalf("consumer moved before commit: %d", f.cons())
	}
	if _, ok, _ := f.r.next(); ok {
		t.Fatal("a discarded record was returned")
	}
	f.r.commit()
	if f.cons() != 64 {
		t.Fatalf("consumer after commit = %d, want 64 (the discarded record's space too)", f.cons())
	}
	long := bytes.Repeat([]byte{3}, 40) // at 64 (offset 0), 48 bytes
	f.add(long, 0)
	if rec, ok, err := f.r.next(); err != nil || !ok || !bytes.Equal(rec, long) {
		t.Fatalf("next = %q %v %v", rec, ok, err)
	}
	f.r.commit()
	wrap := []byte("0123456789abcdef") // at 112 (offset 48): header 48..56, data 56..72 wraps to 0..8
	f.add(wrap, 0)
	if rec, ok, err := f.r.next(); err != nil || !ok || !bytes.Equal(rec, wrap) {
		t.Fatalf("wrapped record = %q %v %v, want %q", rec, ok, err, wrap)
	}
	f.r.commit()
	if f.cons() != 136 {
		t.Fatalf("consumer = %d, want 136", f.cons())
	}
}

func TestRingReaderBusyWaits(t *testing.T) {
	f := newFakeRing(64)
	f.add([]byte("later"), ringBusy)
	if rec, ok, err := f.r.next(); ok || err != nil {
		t.Fatalf("a record still being written was returned: %q %v", rec, err)
	}
	// The kernel commits it: the busy bit clears.
	binary.NativeEndian.PutUint32(f.r.data[0:], 5)
	binary.NativeEndian.PutUint32(f.r.data[64:], 5)
	if rec, ok, err := f.r.next(); !ok || err != nil || string(rec) != "later" {
		t.Fatalf("next = %q %v %v", rec, ok, err)
	}
}

func TestRingReaderBadLength(t *testing.T) {
	f := newFakeRing(64)
	var h [8]byte
	binary.NativeEndian.PutUint32(h[:], 60) // header + 60 > 64: no kernel writes this
	f.put(0, h[:])
	binary.NativeEndian.PutUint64(f.r.prod, 72)
	if _, _, err := f.r.next(); !errors.Is(err, errRingRecord) {
		t.Fatalf("err = %v, want errRingRecord", err)
	}
}

// FuzzRingReader: whatever the ring holds, next never reads outside it,
// returns records that fit, and ends.
func FuzzRingReader(f *testing.F) {
	f.Add([]byte{5, 0, 0, 0, 0, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'}, uint64(16))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint64(1<<40))
	f.Fuzz(func(t *testing.T, content []byte, prod uint64) {
		const size = 256
		r := newFakeRing(size)
		r.put(0, content[:min(len(content), size)])
		binary.NativeEndian.PutUint64(r.r.prod, prod)
		for i := 0; i < size; i++ { // every record takes at least 8 bytes
			rec, ok, err := r.r.next()
			if err != nil || !ok {
				return
			}
			if len(rec) > size-ringHdr {
				t.Fatalf("record of %d bytes from a %d-byte ring", len(rec), size)
			}
		}
		t.Fatalf("more than %d records from a %d-byte ring", size, size)
	})
}

// Records held in place keep their space from the kernel until released,
// in ring order: the consumer stops at the oldest one still held.
func TestRingReaderHold(t *testing.T) {
	f := newFakeRing(256)
	for _, p := range []string{"aaaaaaaa", "bbbbbbbb", "cccccccc", "dddddddd"} { // 16 bytes each
		f.add([]byte(p), 0)
	}
	var ids []uint64
	for i := 0; i < 4; i++ {
		if _, ok, err := f.r.next(); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if i != 2 { // the third is copied, not held
			ids = append(ids, f.r.hold())
		}
	}
	if f.r.heldBytes != 48 {
		t.Fatalf("heldBytes = %d, want 48", f.r.heldBytes)
	}
	f.r.commit()
	if f.cons() != 0 {
		t.Fatalf("consumer = %d, want 0 (the first record is held)", f.cons())
	}
	f.r.release(ids[1]) // the second: the first still holds the consumer
	f.r.commit()
	if f.cons() != 0 {
		t.Fatalf("consumer = %d, want 0", f.cons())
	}
	f.r.release(ids[0])
	f.r.commit()
	if f.cons() != 48 {
		t.Fatalf("consumer = %d, want 48 (up to the fourth, still held)", f.cons())
	}
	f.r.release(ids[0]) // twice: ignored
	f.r.release(ids[2])
	f.r.commit()
	if f.cons() != 64 || f.r.heldBytes != 0 || len(f.r.held) != 0 {
		t.Fatalf("consumer = %d, heldBytes %d, %d held; want 64, 0, 0", f.cons(), f.r.heldBytes, len(f.r.held))
	}
	// Ids stay unique after the list is emptied.
	f.add([]byte("eeeeeeee"), 0)
	f.r.next()
	if id := f.r.hold(); id <= ids[2] {
		t.Fatalf("new id %d reuses an old one (last %d)", id, ids[2])
	}
}

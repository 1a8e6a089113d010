package frame

import (
	"bytes"
	"testing"
)

// writeCounter records every write it is given.
type writeCounter struct {
	writes int
	buf    bytes.Buffer
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes++
	return w.buf.Write(p)
}

// TestQueueFrameWaitsForPush: queued small frames go out together with one
// write on Push; a large payload, or a pending buffer past corkMax, is
// written at once; nothing queued is lost or reordered.
func TestQueueFrameWaitsForPush(t *testing.T) {
	wc := &writeCounter{}
	w := NewWriter(wc)
	for id := uint32(1); id <= 5; id++ {
		h := Header{Type: TypeResponse, ID: id}
		if err := w.QueueFrame(&h, nil, []byte("answer")); err != nil {
			t.Fatal(err)
		}
	}
	if wc.writes != 0 {
		t.Fatalf("%d writes before Push, want 0", wc.writes)
	}
	if w.Idle() {
		t.Fatal("Idle with frames queued")
	}
	if err := w.Push(); err != nil {
		t.Fatal(err)
	}
	if wc.writes != 1 {
		t.Fatalf("%d writes for 5 queued frames, want 1", wc.writes)
	}
	if err := w.Push(); err != nil || wc.writes != 1 {
		t.Fatalf("Push with nothing pending wrote (%d writes, err %v)", wc.writes, err)
	}

	// A large payload is written at once, with what was queued before it.
	h := Header{Type: TypeResponse, ID: 6}
	w.QueueFrame(&h, nil, []byte("small"))
	big := bytes.Repeat([]byte{7}, w.LargePayload)
	h = Header{Type: TypeResponse, ID: 7}
	if err := w.QueueFrame(&h, nil, big); err != nil {
		t.Fatal(err)
	}
	if wc.writes == 1 || !w.Idle() { // (writev: one write on a socket, two here)
		t.Fatalf("large queued payload: written %v, idle %v; want both", wc.writes > 1, w.Idle())
	}

	// Small frames past corkMax are written without a Push.
	chunk := make([]byte, 1<<10)
	n, base := 0, wc.writes
	for id := uint32(8); wc.writes == base; id++ {
		h := Header{Type: TypeResponse, ID: id}
		w.QueueFrame(&h, nil, chunk)
		if n++; n > corkMax/len(chunk)+1 {
			t.Fatalf("%d KiB queued and still not written", n)
		}
	}
	w.Push()

	r := NewReader(&wc.buf, 0)
	for want := uint32(1); ; want++ {
		f, err := r.ReadFrame(nil)
		if err != nil {
			if want != uint32(8+n) {
				t.Fatalf("stream ended after frame %d (%v), want %d frames", want-1, err, 7+n)
			}
			break
		}
		if f.ID != want {
			t.Fatalf("frame %d arrived as number %d", f.ID, want)
		}
	}
}

// TestFrameBuffered: true only when the whole next frame is in the buffer.
func TestFrameBuffered(t *testing.T) {
	var b []byte
	h := Header{Type: TypeResponse, ID: 1, PayloadLen: 3}
	b = append(h.Append(b), "abc"...)
	h = Header{Type: TypeResponse, ID: 2, PayloadLen: 100}
	b = append(h.Append(b), make([]byte, 60)...) // the second frame is cut short
	r := NewReader(bytes.NewReader(b), 0)
	if r.FrameBuffered() {
		t.Fatal("FrameBuffered before anything was read")
	}
	r.Peek(1) // one read brings in all there is
	if !r.FrameBuffered() {
		t.Fatal("the first frame is buffered whole")
	}
	if _, err := r.ReadFrame(nil); err != nil {
		t.Fatal(err)
	}
	if r.FrameBuffered() {
		t.Fatal("FrameBuffered with 60 of 100 payload bytes")
	}
}

package frame

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestPeekFrameResumes: a PeekFrame ended by a read deadline while half a
// frame is in consumes nothing; called again it returns the whole frame.
func TestPeekFrameResumes(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r := NewReader(a, 1024)
	h := Header{Type: TypeResponse, ID: 7, PayloadLen: 5}
	wire := append(h.Append(nil), "hello"...)
	go b.Write(wire[:10])
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.PeekFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
	a.SetReadDeadline(time.Time{})
	go b.Write(wire[10:])
	got, err := r.PeekFrame()
	if err != nil || got != h {
		t.Fatalf("PeekFrame after the interruption: %+v %v", got, err)
	}
	f, err := r.ReadFrame(nil)
	if err != nil || string(f.Payload) != "hello" || f.ID != 7 {
		t.Fatalf("ReadFrame: %+v %v", f, err)
	}
	// A frame larger than the buffer: header and ErrNotBuffered.
	big := Header{Type: TypeResponse, ID: 8, PayloadLen: 4096}
	go b.Write(big.Append(nil))
	if got, err := r.PeekFrame(); err != ErrNotBuffered || got != big {
		t.Fatalf("large frame: %+v %v", got, err)
	}
}

package rpc

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// TestShmStalledTotalSlowHandler: an answer that finds the server's half
// full while the server's total is over MaxServerBytes goes on the socket
// even when its call ran off the reader. The handler is slow, so the inline
// watchdog hands reading to a new reader before the answer's bytes count in
// the total; that reader found the total under the limit and went to read
// the socket, and the answer waited for releases nobody would read (the
// client sends nothing more) until its call's deadline. This was the
// 1-in-10 -race timeout of TestShmStalledCounted/total.
func TestShmStalledTotalSlowHandler(t *testing.T) {
	s := NewServer(ServerOptions{MaxServerBytes: 300 << 10})
	s.HandleRaw("slowecho", func(_ context.Context, req, dst []byte) ([]byte, error) {
		time.Sleep(40 * time.Millisecond)
		return append(dst, req...), nil
	})
	c := rawDial(t, startServer(t, s))
	c.accepted() // a server half of 512 KiB, never released by this client
	req := pattern(stallReq, 7)
	for id := uint32(1); id <= 3; id++ {
		c.write(frame.TypeRequest, 0, id, frame.AppendRequestHead(nil, "slowecho"), req)
		h, _, payload, err := c.readFrame()
		if err != nil || h.Type != frame.TypeResponse || h.ID != id {
			t.Fatalf("answer %d: %+v %v", id, h, err)
		}
		inRegion := h.Flags&shm.FlagShm != 0
		switch {
		case id <= 2 && !inRegion:
			t.Fatalf("answer %d came on the socket, want it in the region (the half has room for two)", id)
		case id == 3 && inRegion:
			t.Fatalf("answer 3 came through the region, want it on the socket (the half is full)")
		case id == 3 && !bytes.Equal(payload, req):
			t.Fatalf("answer 3: %d bytes, not the request echoed", len(payload))
		}
	}
	if st := s.Stats().Shm; st.Stalled != 1 || st.Sent != 2 {
		t.Fatalf("stats %+v: want 1 stalled and 2 answers sent through the region", st)
	}
}

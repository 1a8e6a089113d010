package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// TestShmCallRawView: a response through the region is read in place
// (InPlace, no copy into dst) and its slot stays the client's until
// Release; small responses land in dst; a client holding views fills the
// server's half, after which the server's answers wait within their
// deadline, and go through again once the views are released.
func TestShmCallRawView(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		s := NewServer(ServerOptions{ShmInPlace: inPlace})
		s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
		c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
		ctx := context.Background()
		th := shm.DefaultThreshold
		for i, n := range []int{0, 100, th - 1, th, 64 << 10, 1 << 20, 3<<20 + 5} {
			req := pattern(n, i)
			dst := make([]byte, 0, 64)
			v, err := c.CallRawView(ctx, "echo", req, dst)
			if err != nil {
				t.Fatalf("%d bytes: %v", n, err)
			}
			if !bytes.Equal(v.Bytes(), req) {
				t.Fatalf("%d bytes: the view differs", n)
			}
			if v.InPlace() != (n >= th) {
				t.Fatalf("%d bytes: in place %v", n, v.InPlace())
			}
			if v.InPlace() && overlaps(v.Bytes(), dst[:cap(dst)]) {
				t.Fatalf("%d bytes: in place, yet in dst", n)
			}
			if v.InPlace() && s.ShmStats().InUse == 0 {
				t.Fatalf("%d bytes: the server's slot was freed while the view holds it", n)
			}
			v.Release()
			v.Release() // a second Release does nothing
			if v.Bytes() != nil {
				t.Fatal("Bytes after Release")
			}
			waitFor(t, "the view's slot back on the server", func() bool { return s.ShmStats().InUse == 0 })
		}

		// Held views fill the server's half (32 MiB): the next large answer
		// waits for space within its deadline, and fails with it.
		req := pattern(1<<20, 7)
		var held []RawView
		for s.ShmStats().InUse+1<<20 <= s.ShmStats().Capacity {
			v, err := c.CallRawView(ctx, "echo", req, nil)
			if err != nil || !v.InPlace() {
				t.Fatalf("view %d: %v in place %v", len(held), err, v.InPlace())
			}
			held = append(held, v)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		waitsBefore := s.ShmStats().Waits
		_, err := c.CallRawView(short, "echo", req, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) && CodeOf(err) != DeadlineExceeded {
			t.Fatalf("with the server's half full of held views: %v, want the deadline", err)
		}
		if s.ShmStats().Waits == waitsBefore {
			t.Fatal("the server did not wait for space")
		}
		for i := range held {
			if !bytes.Equal(held[i].Bytes(), req) {
				t.Fatalf("held view %d changed", i)
			}
			held[i].Release()
		}
		v, err := c.CallRawView(ctx, "echo", req, nil)
		if err != nil || !bytes.Equal(v.Bytes(), req) {
			t.Fatalf("after the releases: %v", err)
		}
		v.Release()
		waitFor(t, "every slot back", func() bool { return s.ShmStats().InUse == 0 && c.ShmStats().InUse == 0 })
	}
}

// TestShmViewOutlivesConnection: a view stays readable after its
// connection closed (the mapping is held), Release then is harmless, and
// the mapping goes with it.
func TestShmViewOutlivesConnection(t *testing.T) {
	c := dialOpts(t, startServer(t, echoServer()), ClientOptions{Conns: 1, LargeConns: 1})
	req := pattern(256<<10, 3)
	v, err := c.CallRawView(context.Background(), "echo", req, nil)
	if err != nil || !v.InPlace() {
		t.Fatalf("%v in place %v", err, v.InPlace())
	}
	addr := uintptr(unsafePointer(v.Bytes()))
	c.Close()
	if !bytes.Equal(v.Bytes(), req) {
		t.Fatal("the view changed when its connection closed")
	}
	if !regionMapped(t, addr) {
		t.Fatal("the region was unmapped under a held view")
	}
	v.Release()
	waitFor(t, "the client's mapping gone", func() bool { return !regionMapped(t, addr) })
}

// TestShmViewAllocs: a call through CallRawView allocates nothing in the
// client, the server with ShmInPlace nothing either (≤ 1 together, as
// every call path).
func TestShmViewAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items at random: allocation counts mean nothing (make test runs this package without -race too)")
	}
	s := NewServer(ServerOptions{ShmInPlace: true})
	s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := pattern(1<<20, 1)
	call := func() {
		v, err := c.CallRawView(ctx, "echo", req, nil)
		if err != nil || !v.InPlace() || len(v.Bytes()) != len(req) {
			t.Fatalf("%v", err)
		}
		v.Release()
	}
	for range 100 {
		call()
	}
	time.Sleep(150 * time.Millisecond)
	if n := testing.AllocsPerRun(300, call); n > 1.05 {
		t.Errorf("%.2f allocations per call, client + server; want at most 1", n)
	}
}

// TestShmViewHostileServer: a server that answers with a slot overlapping
// one a RawView still holds fails that call and the connection with
// protocol_violation; a server that rewrites a held slot changes what the
// view shows (CallRawView's documented cost) but nothing else; the held
// view stays readable after the connection failed, and Release is safe.
func TestShmViewHostileServer(t *testing.T) {
	half := uint32(shm.DefaultRegion / 2)
	rewritten := make(chan struct{})
	addr := fakeShmServer(t, func(uc *net.UnixConn, r *shm.Region, id uint32) {
		d := shm.Desc{Off: half, Len: 100}
		copy(r.Bytes(d), bytes.Repeat([]byte{'a'}, 100))
		var p [8]byte
		d.Put(p[:])
		writeFrame(uc, frame.TypeResponse, shm.FlagShm, id, p[:])
		var h [16]byte
		if _, err := io.ReadFull(uc, h[:]); err != nil {
			return
		}
		fh := frame.ParseHeader(h[:])
		io.CopyN(io.Discard, uc, int64(fh.HeadLen)+int64(fh.PayloadLen))
		copy(r.Bytes(d), bytes.Repeat([]byte{'b'}, 100)) // the hostile part: rewrite the held slot
		close(rewritten)
		shm.Desc{Off: half + 50, Len: 100}.Put(p[:]) // overlaps the held slot
		writeFrame(uc, frame.TypeResponse, shm.FlagShm, fh.ID, p[:])
	})
	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, NoReconnect: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v, err := c.CallRawView(ctx, "echo", pattern(64<<10, 1), nil)
	if err != nil || !v.InPlace() || !bytes.Equal(v.Bytes(), bytes.Repeat([]byte{'a'}, 100)) {
		t.Fatalf("first call: %v, in place %v, %q", err, v.InPlace(), v.Bytes())
	}
	_, err = c.CallRawView(ctx, "echo", pattern(64<<10, 2), nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != ProtocolViolation || !strings.Contains(e.Message, "overlaps") {
		t.Fatalf("answer overlapping a held view: %v, want protocol_violation", err)
	}
	<-rewritten
	if !bytes.Equal(v.Bytes(), bytes.Repeat([]byte{'b'}, 100)) {
		t.Fatal("the view does not show the server's rewrite: it is not in place")
	}
	v.Release()
}

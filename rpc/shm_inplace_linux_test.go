package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// inRegion reports whether p's memory lies in the shared region of one of
// s's connections (white box: the handler asks while it runs, so the
// region is mapped).
func inRegion(s *Server, p []byte) bool {
	if cap(p) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		cs := c.shm
		c.mu.Unlock()
		if cs != nil && cs.region.Acquire() {
			all := cs.region.Bytes(shm.Desc{Off: 0, Len: uint32(cs.region.Size())})
			in := overlaps(p[:cap(p)], all)
			cs.region.Release()
			if in {
				return true
			}
		}
	}
	return false
}

// inPlaceServer is a server with ShmInPlace and handlers that use dst in
// every way a handler can: build the answer in it, return req itself,
// return a part of dst, outgrow it, answer short, fail.
func inPlaceServer(t *testing.T) (*Server, *atomic.Int64) {
	s := NewServer(ServerOptions{ShmInPlace: true, Logger: slog.New(slog.DiscardHandler)}) // quiet: one handler panics on purpose
	var notInPlace atomic.Int64                                                            // large calls whose req or dst was not in the region
	check := func(req, dst []byte) {
		if len(req) >= shm.DefaultThreshold && (!inRegion(s, req) || !inRegion(s, dst) || cap(dst) < len(req)) {
			notInPlace.Add(1)
		}
	}
	s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) {
		check(req, dst)
		return append(dst, req...), nil
	})
	s.HandleRaw("same", func(_ context.Context, req, dst []byte) ([]byte, error) { return req, nil })
	s.HandleRaw("tail", func(_ context.Context, req, dst []byte) ([]byte, error) {
		if len(req) == 0 {
			return nil, nil
		}
		return append(dst, req...)[1:], nil
	})
	s.HandleRaw("twice", func(_ context.Context, req, dst []byte) ([]byte, error) {
		return append(append(dst, req...), req...), nil
	})
	s.HandleRaw("short", func(_ context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req[:min(len(req), 10)]...), nil
	})
	s.HandleRaw("fail", func(_ context.Context, req, dst []byte) ([]byte, error) {
		_ = append(dst, req...)
		return nil, Errorf(InvalidArgument, "no %d", len(req))
	})
	s.HandleRaw("panic", func(_ context.Context, req, dst []byte) ([]byte, error) {
		_ = append(dst, req...)
		panic("in place")
	})
	s.HandleRawStream("items", func(_ context.Context, req []byte, send func([]byte) error) error {
		for i := 0; i < 3; i++ {
			if err := send(req); err != nil {
				return err
			}
		}
		return nil
	})
	return s, &notInPlace
}

// TestShmInPlaceAnswers: with ServerOptions.ShmInPlace every way a handler
// can answer gives the same bytes as the copying path, at sizes around the
// threshold and up to 3 MiB; large requests were read in place and large
// answers built in a slot of the server's half; every slot comes back.
func TestShmInPlaceAnswers(t *testing.T) {
	s, notInPlace := inPlaceServer(t)
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	th := shm.DefaultThreshold
	for i, n := range []int{0, 100, th - 1, th, th + 1, 64 << 10, 1 << 20, 3<<20 + 5} {
		req := pattern(n, i)
		want := map[string][]byte{
			"echo":  req,
			"same":  req,
			"twice": append(append([]byte(nil), req...), req...),
			"short": req[:min(n, 10)],
		}
		if n > 0 {
			want["tail"] = req[1:]
		} else {
			want["tail"] = nil
		}
		for _, m := range []string{"echo", "same", "tail", "twice", "short"} {
			resp, err := c.CallRaw(ctx, m, req, nil)
			if err != nil {
				t.Fatalf("%s of %d bytes: %v", m, n, err)
			}
			if !bytes.Equal(resp, want[m]) {
				t.Fatalf("%s of %d bytes: the answer differs (%d bytes, want %d)", m, n, len(resp), len(want[m]))
			}
		}
		_, err := c.CallRaw(ctx, "fail", req, nil)
		var e *Error
		if !errors.As(err, &e) || e.Code != InvalidArgument || e.Message != "no "+strconv.Itoa(n) {
			t.Fatalf("fail of %d bytes: %v", n, err)
		}
		if _, err := c.CallRaw(ctx, "panic", req, nil); !errors.As(err, &e) || e.Code != Internal {
			t.Fatalf("panic of %d bytes: %v", n, err)
		}
		st, err := c.Stream(ctx, "items", req)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 3; k++ {
			item, err := st.RecvRaw()
			if err != nil || !bytes.Equal(item, req) {
				t.Fatalf("stream of %d bytes, item %d: %v", n, k, err)
			}
		}
		if _, err := st.RecvRaw(); err == nil {
			t.Fatal("stream did not end")
		}
	}
	if n := notInPlace.Load(); n != 0 {
		t.Fatalf("%d large calls had req or dst outside the region", n)
	}
	waitFor(t, "every slot released", func() bool {
		cs, ss := c.ShmStats(), s.ShmStats()
		return cs.InUse == 0 && ss.InUse == 0
	})
}

// TestShmInPlaceClientRewrites: ShmInPlace's documented cost, shown and
// bounded. A client that rewrites its slot while the handler runs changes
// the bytes the handler sees (they are read in place), the slot is
// released only after the handler returns, a release of a response slot
// other than the one handed over (its length before the shrink) is that
// client's protocol violation, and the server keeps serving others.
func TestShmInPlaceClientRewrites(t *testing.T) {
	s := NewServer(ServerOptions{ShmInPlace: true})
	s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	changed := make(chan bool, 1)
	var returned atomic.Bool
	s.HandleRaw("hold", func(_ context.Context, req, dst []byte) ([]byte, error) {
		snap := append([]byte(nil), req...)
		seen := false
		for end := time.Now().Add(5 * time.Second); !seen && time.Now().Before(end); time.Sleep(time.Millisecond) {
			seen = !bytes.Equal(snap, req) // the client scribbles meanwhile
		}
		changed <- seen
		out := append(dst, req[:100]...)
		returned.Store(true)
		return out, nil
	})
	addr := startServer(t, s)
	good := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	stillServes := func() {
		t.Helper()
		req := pattern(200<<10, 9)
		resp, err := good.CallRaw(context.Background(), "echo", req, nil)
		if err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("the server stopped serving others: %v", err)
		}
	}
	stillServes()

	c := rawDial(t, addr)
	c.accepted()
	d := shm.Desc{Off: 0, Len: 64 << 10}
	slot := c.region.Bytes(d)
	copy(slot, pattern(len(slot), 1))
	c.shmRequest(1, "hold", d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	stopScribbling := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopScribbling() // before the region is unmapped, also on a failure
	go func() {            // the hostile part: rewrite the handed-over slot, hard
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(slot[(i*8)%len(slot):], uint64(i))
		}
	}()
	var resp shm.Desc
	for gotRel, gotResp := false, false; !gotRel || !gotResp; {
		h, _, p, err := c.readFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch h.Type {
		case frame.Type(shm.TypeRelease):
			if !returned.Load() {
				t.Fatal("the request's slot was released while its handler ran")
			}
			if !bytes.Equal(p, shm.AppendRelease(nil, d)[16:]) {
				t.Fatalf("release %x, want the request's slot", p)
			}
			gotRel = true
		case frame.TypeResponse:
			if h.Flags&shm.FlagShm == 0 {
				t.Fatalf("answer of %d bytes on the socket, want it in the slot it was built in", len(p))
			}
			if resp, err = shm.ParseDesc(p); err != nil || resp.Len != 100 {
				t.Fatalf("answer descriptor %+v %v, want 100 bytes", resp, err)
			}
			gotResp = true
		default:
			t.Fatalf("unexpected %+v", h)
		}
	}
	stopScribbling()
	if !<-changed {
		t.Fatal("the handler never saw the client's rewrites: the request was not read in place")
	}
	stillServes()
	// The answer's slot was shrunk to 100 bytes: releasing it at the size
	// the server first took (64 KiB) is not a slot it handed over.
	c.write(frame.Type(shm.TypeRelease), 0, 0, nil, shm.AppendRelease(nil, shm.Desc{Off: resp.Off, Len: 64 << 10})[16:])
	c.expectViolation("not a slot handed over")
	stillServes()
	waitFor(t, "the hostile client's slots freed", func() bool { return s.ShmStats().Conns == 1 && s.ShmStats().InUse == 0 })
}

// regionMapped reports whether addr lies in a shared-region mapping of this
// process (/proc/self/maps).
func regionMapped(t *testing.T, addr uintptr) bool {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "memfd:udskit-shm") {
			continue
		}
		var lo, hi uintptr
		if _, err := fmt.Sscanf(l, "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return true
		}
	}
	return false
}

// TestShmInPlaceCallEnds: a handler reading its request in place may go on
// after its call was canceled, timed out or lost its connection: the slot
// and the mapping stay valid until it returns (no fault), then the slot is
// released (or, the connection gone, the region unmapped).
func TestShmInPlaceCallEnds(t *testing.T) {
	s := NewServer(ServerOptions{ShmInPlace: true})
	type result struct {
		sum  byte
		addr uintptr
	}
	began := make(chan uintptr, 1)
	done := make(chan result, 1)
	s.HandleRaw("late", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		began <- uintptr(unsafePointer(req))
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // after the call ended: read and write the slots anyway
		var sum byte
		for _, b := range req {
			sum += b
		}
		dst = append(dst, req...)
		done <- result{sum, uintptr(unsafePointer(req))}
		return dst, nil
	})
	addr := startServer(t, s)
	req := pattern(256<<10, 4)
	var want byte
	for _, b := range req {
		want += b
	}
	for _, how := range []string{"timeout", "cancel", "connection closed"} {
		t.Run(how, func(t *testing.T) {
			c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if how == "timeout" {
				ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
			}
			errc := make(chan error, 1)
			go func() {
				_, err := c.CallRaw(ctx, "late", req, nil)
				errc <- err
			}()
			slotAddr := <-began
			switch how {
			case "cancel":
				cancel()
			case "connection closed":
				c.Close()
			}
			if err := <-errc; err == nil {
				t.Fatal("the call succeeded")
			}
			r := <-done
			if r.sum != want || r.addr != slotAddr {
				t.Fatalf("the handler read %d at %#x after the call ended, want %d at %#x", r.sum, r.addr, want, slotAddr)
			}
			if how == "connection closed" {
				waitFor(t, "the server's mapping of the closed connection's region gone", func() bool { return !regionMapped(t, slotAddr) })
				return
			}
			waitFor(t, "the slots released", func() bool { return c.ShmStats().InUse == 0 && s.ShmStats().InUse == 0 })
		})
	}
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// TestShmInPlaceDstSlotsDoNotFillTheHalf: with ShmInPlace every large unary
// call is offered a dst slot; handlers that answer apart from it (return
// req) must not hold it while their answer waits for a slot. 32 calls of
// 1 MiB in their handlers at once hold dst slots filling the 32 MiB half;
// their answers need 32 MiB more: all must still complete.
func TestShmInPlaceDstSlotsDoNotFillTheHalf(t *testing.T) {
	const n = 32
	s := NewServer(ServerOptions{ShmInPlace: true, MaxConnBytes: 64 << 20}) // the budget must let 32 MiB of requests in
	var in atomic.Int32
	all := make(chan struct{})
	s.HandleRaw("same", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		if in.Add(1) == n {
			close(all)
		}
		select { // every call holds its dst slot before any answers
		case <-all:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return req, nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			req := pattern(1<<20, i)
			resp, err := c.CallRaw(ctx, "same", req, nil)
			if err == nil && !bytes.Equal(resp, req) {
				err = fmt.Errorf("call %d: the answer differs", i)
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("%v (server %+v)", err, s.ShmStats())
		}
	}
	waitFor(t, "every slot released", func() bool { return c.ShmStats().InUse == 0 && s.ShmStats().InUse == 0 })
}

package rpc

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// bothWays runs f on the socket and then with ShmCalls on (dial and
// dialOpts), where bidi and client-streaming calls go through stream slots
// (spec 10.9), checking that they did.
func bothWays(t *testing.T, f func(t *testing.T)) {
	t.Run("socket", f)
	t.Run("slots", func(t *testing.T) {
		dialShmStreams = true
		defer func() { dialShmStreams = false }()
		before := streamSlotCalls.Load()
		f(t)
		if streamSlotCalls.Load() == before {
			t.Fatal("no call went through a stream slot")
		}
	})
}

func TestShmStreamsBidiSum(t *testing.T)         { bothWays(t, TestBidiSum) }
func TestShmStreamsBidiUntyped(t *testing.T)     { bothWays(t, TestBidiUntyped) }
func TestShmStreamsClientStreaming(t *testing.T) { bothWays(t, TestClientStreaming) }

func TestShmStreamsHalfClose(t *testing.T)        { bothWays(t, TestBidiHalfCloseServerKeepsSending) }
func TestShmStreamsThousand(t *testing.T)         { bothWays(t, TestBidiThousandConcurrent) }
func TestShmStreamsCancelFromClient(t *testing.T) { bothWays(t, TestBidiCancelFromClient) }
func TestShmStreamsServerEndsCall(t *testing.T)   { bothWays(t, TestBidiServerEndsCall) }
func TestShmStreamsDeadline(t *testing.T)         { bothWays(t, TestBidiDeadline) }
func TestShmStreamsHandlerStops(t *testing.T)     { bothWays(t, TestBidiHandlerStopsReading) }
func TestShmStreamsClientStops(t *testing.T)      { bothWays(t, TestBidiClientStopsReading) }
func TestShmStreamsKindMismatch(t *testing.T)     { bothWays(t, TestBidiKindMismatch) }
func TestShmStreamsInterceptors(t *testing.T)     { bothWays(t, TestBidiInterceptors) }
func TestShmStreamsMetadata(t *testing.T)         { bothWays(t, TestBidiMetadata) }
func TestShmStreamsDrain(t *testing.T)            { bothWays(t, TestBidiDrain) }

// slotPingPongs runs callers bidi echo calls of rounds round trips each of
// size bytes on c ("bidi-echo": HandleRawBidiView echo), checking each echo.
func slotPingPongs(ctx context.Context, c *Client, callers, rounds, size int) error {
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := c.Bidi(ctx, "bidi-echo")
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			p := make([]byte, size)
			for i := range rounds {
				for j := range p {
					p[j] = byte(g + i + j)
				}
				if err := st.SendRaw(p); err != nil {
					errs <- fmt.Errorf("caller %d round %d send: %w", g, i, err)
					return
				}
				got, err := st.RecvRawView()
				if err != nil || !bytes.Equal(got, p) {
					errs <- fmt.Errorf("caller %d round %d: %d bytes %v, want %d bytes echoed", g, i, len(got), err, size)
					return
				}
			}
			if err := st.CloseSend(); err != nil {
				errs <- err
				return
			}
			if _, err := st.RecvRaw(); err != io.EOF {
				errs <- fmt.Errorf("caller %d end: %v", g, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func TestShmStreamsPingPongProbe(t *testing.T) {
	_, addr := streamServer(t)
	c, x := slotClient(t, addr)
	for _, callers := range []int{1, 16} {
		n0, m0 := c.slotNaps()
		t0 := time.Now()
		if err := slotPingPongs(context.Background(), c, callers, 2000, 1024); err != nil {
			t.Fatal(err)
		}
		n, m := c.slotNaps()
		t.Logf("%d callers: %v per round, naps %d missed %d, handed %d", callers, time.Since(t0)/time.Duration(2000), n-n0, m-m0, x.handed.Load())
	}
}

type streamFrameVec struct {
	Name, Hex, Error string
	Len              uint32
	MaxFrame         uint32 `json:"max_frame"`
	OK               bool
	Streams, Single  bool
}

// streamVecs is shm.json's frames of spec 10.9 (streams).
type streamVecs struct {
	Open   []streamFrameVec `json:"open_frames"`
	Client []streamFrameVec `json:"client_frames"`
	Server []streamFrameVec `json:"server_frames"`
}

func loadStreamVecs(tb testing.TB) *streamVecs {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var v struct{ Streams streamVecs }
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatal(err)
	}
	return &v.Streams
}

// errName is the vector name of a check's error ("" for nil).
func errName(err error) string {
	var se *shm.Error
	var pe *frame.ProtocolError
	switch {
	case errors.As(err, &se):
		return se.Name
	case errors.As(err, &pe):
		return pe.Name
	}
	return ""
}

// slotFrame copies a vector's frame into an area and out as a receiver
// does (the length word checked), then parses its header.
func slotFrame(raw []byte, n uint32) ([]byte, frame.Header, error) {
	var area, buf [shm.CallAreaSize]byte
	copy(area[:], raw)
	f, err := shm.CopyFrame(&buf, area[:], n, frame.HeaderSize)
	if err != nil {
		return nil, frame.Header{}, err
	}
	return f, frame.ParseHeader(f), nil
}

// TestVectorStreamFrames: the frames of spec 10.9 in shm.json (streams):
// opening requests, the client's frames in a stream slot (the server's
// checks) and the server's items (the client's checks).
func TestVectorStreamFrames(t *testing.T) {
	s := loadStreamVecs(t)
	if len(s.Open) < 4 || len(s.Client) < 8 || len(s.Server) < 6 {
		t.Fatalf("%d open, %d client, %d server stream vectors", len(s.Open), len(s.Client), len(s.Server))
	}
	const id = 0x80000001 // slot 0, req_seq 1
	run := func(what string, vs []streamFrameVec, check func(f []byte, h frame.Header, e streamFrameVec) error) {
		for _, e := range vs {
			raw, _ := hex.DecodeString(e.Hex)
			f, h, err := slotFrame(raw, e.Len)
			if err == nil {
				err = check(f, h, e)
			}
			if (err == nil) != e.OK || errName(err) != e.Error {
				t.Errorf("%s %s: %v (name %q), want ok %v error %q", what, e.Name, err, errName(err), e.OK, e.Error)
			}
		}
	}
	run("open", s.Open, func(f []byte, _ frame.Header, e streamFrameVec) error {
		_, _, _, err := parseSlotRequest(f, e.MaxFrame, e.Streams)
		return err
	})
	run("client", s.Client, func(f []byte, h frame.Header, e streamFrameVec) error {
		return checkStreamFrame(f, h, id, e.MaxFrame)
	})
	run("server", s.Server, func(f []byte, h frame.Header, e streamFrameVec) error {
		return checkItemFrame(f, h, id, e.Single, e.MaxFrame)
	})
}

// FuzzStreamSlotFrames: whatever a peer writes in a stream slot's area
// and length word, the checks of 10.9 never panic, and a frame they pass
// has lengths that add up, an empty head (items) and a payload within
// the max frame.
func FuzzStreamSlotFrames(f *testing.F) {
	v := loadStreamVecs(f)
	for _, vs := range [][]streamFrameVec{v.Open, v.Client, v.Server} {
		for _, e := range vs {
			raw, _ := hex.DecodeString(e.Hex)
			f.Add(raw, e.Len)
		}
	}
	const maxFrame = 1 << 20
	f.Fuzz(func(t *testing.T, raw []byte, n uint32) {
		fr, h, err := slotFrame(raw, n)
		if err != nil {
			return
		}
		for _, single := range []bool{false, true} {
			if checkItemFrame(fr, h, h.ID, single, maxFrame) == nil &&
				(h.Type != frame.TypeStreamData || h.HeadLen != 0 || frame.HeaderSize+int(h.PayloadLen) != len(fr) || h.PayloadLen > maxFrame) {
				t.Fatalf("checkItemFrame passed %+v (%d bytes)", h, len(fr))
			}
		}
		if checkStreamFrame(fr, h, h.ID, maxFrame) == nil &&
			(h.Type != frame.TypeRequestData && h.Type != frame.TypeRequestEnd || h.HeadLen != 0 || frame.HeaderSize+int(h.PayloadLen) != len(fr) || h.PayloadLen > maxFrame) {
			t.Fatalf("checkStreamFrame passed %+v (%d bytes)", h, len(fr))
		}
		if h2, head, p, err := parseSlotRequest(fr, maxFrame, true); err == nil &&
			(h2.Type != frame.TypeRequest || frame.HeaderSize+len(head)+len(p) != len(fr) || h2.Flags&frame.FlagClientStream != 0 && len(p) != 0) {
			t.Fatalf("parseSlotRequest passed %+v", h2)
		}
	})
}

// streamServer is echoServer with "bidi-echo" (HandleRawBidiView echo),
// "hold" (a bidi handler that waits for its ctx) and "sum"/"total".
func streamServer(t *testing.T) (*Server, string) {
	s := echoServer()
	registerSum(s)
	s.HandleRawBidiView("bidi-echo", rawEchoBidiHandler)
	s.HandleRawBidi("hold", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	return s, startServer(t, s)
}

// openedSlot opens a "hold" call on c and returns its stream slot once the
// server took its request (req_taken).
func openedSlot(t *testing.T, c *Client) *cliStream {
	t.Helper()
	return openedSlotOf(t, c, "hold")
}

// openedSlotOf is openedSlot for a call of method.
func openedSlotOf(t *testing.T, c *Client, method string) *cliStream {
	t.Helper()
	st, err := c.Bidi(context.Background(), method)
	if err != nil {
		t.Fatal(err)
	}
	ss := st.slot
	if ss == nil {
		t.Fatal("the call did not open in a stream slot")
	}
	waitFor(t, "the server to take the opening request", func() bool {
		return ss.y.x.calls.ReqTaken(ss.k).Load() == ss.y.x.calls.ReqSeq(ss.k).Load()
	})
	return ss
}

// publishReq writes f in slot k's client area and publishes it with
// req_seq + step, as a hostile client would.
func publishReq(x *clientCalls, k int, f []byte, step uint32) {
	copy(x.calls.ReqArea(k), f)
	x.calls.ReqLen(k).Store(uint32(len(f)))
	x.calls.ReqSeq(k).Add(step)
	x.calls.Bell().Add(1)
	shm.FutexWake(x.calls.Bell(), 1)
}

// publishItem writes f in slot k's server area and publishes it with
// str_seq + step, as a hostile server would.
func publishItem(x *clientCalls, k int, f []byte, step uint32) {
	copy(x.calls.AnsArea(k), f)
	x.calls.StrLen(k).Store(uint32(len(f)))
	x.calls.StrSeq(k).Add(step)
	x.calls.CBell().Add(1)
	shm.FutexWake(x.calls.CBell(), 1)
}

func rawFrame(typ frame.Type, flags uint8, id uint32, head, payload []byte) []byte {
	h := frame.Header{Type: typ, Flags: flags, ID: id, HeadLen: uint16(len(head)), PayloadLen: uint32(len(payload))}
	b := make([]byte, frame.HeaderSize, frame.HeaderSize+len(head)+len(payload))
	h.Put(b)
	return append(append(b, head...), payload...)
}

// TestShmStreamsHostile: a peer that breaks 10.9 by writing the new words
// and areas (a client frame of another call or kind, a request_seq that
// jumps, an item sequence that jumps, an item with a head, a final frame
// of the wrong kind, an answer sequence out of range) ends only its own
// connection with protocol_violation; another client keeps working.
func TestShmStreamsHostile(t *testing.T) {
	s, addr := streamServer(t)
	good, _ := slotClient(t, addr)
	hostile := func(name string, f func(x *clientCalls, ss *cliStream)) slotHostileCase {
		return slotHostileCase{name, func(t *testing.T, c *Client, x *clientCalls) {
			f(x, openedSlot(t, c))
		}}
	}
	cases := []slotHostileCase{
		hostile("client: request_data of another call", func(x *clientCalls, ss *cliStream) {
			publishReq(x, ss.k, rawFrame(frame.TypeRequestData, 0, ss.id+1, nil, []byte("abc")), 1)
		}),
		hostile("client: a request while the stream call is open", func(x *clientCalls, ss *cliStream) {
			publishReq(x, ss.k, rawFrame(frame.TypeRequest, frame.FlagClientStream|frame.FlagStream, ss.id, []byte("\x04\x00hold"), nil), 1)
		}),
		hostile("client: request_credit in a stream slot", func(x *clientCalls, ss *cliStream) {
			publishReq(x, ss.k, rawFrame(frame.TypeRequestCredit, 0, ss.id, nil, nil), 1)
		}),
		hostile("client: req_seq jumps by 2", func(x *clientCalls, ss *cliStream) {
			publishReq(x, ss.k, rawFrame(frame.TypeRequestData, 0, ss.id, nil, []byte("abc")), 2)
		}),
		hostile("client: request_data after request_end", func(x *clientCalls, ss *cliStream) {
			publishReq(x, ss.k, rawFrame(frame.TypeRequestEnd, 0, ss.id, nil, nil), 1)
			waitFor(t, "request_end taken", func() bool { return x.calls.ReqTaken(ss.k).Load() == x.calls.ReqSeq(ss.k).Load() })
			publishReq(x, ss.k, rawFrame(frame.TypeRequestData, 0, ss.id, nil, []byte("abc")), 1)
		}),
		hostile("client: a frame length over the area", func(x *clientCalls, ss *cliStream) {
			x.calls.ReqLen(ss.k).Store(1 << 20)
			x.calls.ReqSeq(ss.k).Add(1)
			x.calls.Bell().Add(1)
			shm.FutexWake(x.calls.Bell(), 1)
		}),
		hostile("server: str_seq jumps by 2", func(x *clientCalls, ss *cliStream) {
			publishItem(x, ss.k, rawFrame(frame.TypeStreamData, 0, ss.id, nil, []byte("abc")), 2)
		}),
		hostile("server: stream_data with a head", func(x *clientCalls, ss *cliStream) {
			publishItem(x, ss.k, rawFrame(frame.TypeStreamData, 0, ss.id, []byte("h"), []byte("abc")), 1)
		}),
		hostile("server: stream_data of another call", func(x *clientCalls, ss *cliStream) {
			publishItem(x, ss.k, rawFrame(frame.TypeStreamData, 0, ss.id+1, nil, []byte("abc")), 1)
		}),
		hostile("server: a response as a bidi call's final frame", func(x *clientCalls, ss *cliStream) {
			f := rawFrame(frame.TypeResponse, 0, ss.id, nil, []byte("abc"))
			copy(x.calls.AnsArea(ss.k), f)
			x.calls.AnsLen(ss.k).Store(uint32(len(f)))
			x.calls.AnsSeq(ss.k).Store(x.calls.ReqSeq(ss.k).Load())
			x.calls.CBell().Add(1)
			shm.FutexWake(x.calls.CBell(), 1)
		}),
		hostile("server: req_taken out of range", func(x *clientCalls, ss *cliStream) {
			x.calls.ReqTaken(ss.k).Store(x.calls.ReqSeq(ss.k).Load() + 5)
			ss.send(frame.TypeRequestData, []byte("x")) // the client's Send checks the word
		}),
		{"client: str_taken out of range", func(t *testing.T, c *Client, x *clientCalls) {
			ss := openedSlotOf(t, c, "bidi-echo")
			x.calls.StrTaken(ss.k).Store(x.calls.StrSeq(ss.k).Load() + 5)
			ss.send(frame.TypeRequestData, []byte("x")) // the server's send of the echo checks it
		}},
		hostile("server: ans_seq out of range", func(x *clientCalls, ss *cliStream) {
			x.calls.AnsSeq(ss.k).Store(x.calls.ReqSeq(ss.k).Load() + 7)
			x.calls.CBell().Add(1)
			shm.FutexWake(x.calls.CBell(), 1)
		}),
	}
	runSlotHostile(t, s, addr, good, 64, false, cases)
	if err := slotPingPongs(context.Background(), good, 4, 50, 1024); err != nil {
		t.Fatalf("bidi calls on the good connection: %v", err)
	}
}

// TestShmStreamsEchoSizes: bidi echoes of 0 B, 1 KiB, 64 KiB and 1 MiB
// (inline, in the slot's payload area, in a payload slot) come back byte
// for byte through stream slots, on 16 calls at once, and a
// client-streaming call of the same items answers their total length; the
// payload slots are all released afterwards.
func TestShmStreamsEchoSizes(t *testing.T) {
	s, addr := streamServer(t)
	s.HandleRawClientStream("count", func(ctx context.Context, recv func() ([]byte, error), dst []byte) ([]byte, error) {
		n := 0
		for {
			it, err := recv()
			if err == io.EOF {
				return fmt.Appendf(dst, "%d", n), nil
			}
			if err != nil {
				return nil, err
			}
			n += len(it)
		}
	})
	c, x := slotClient(t, addr)
	before := streamSlotCalls.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, size := range []int{0, 1 << 10, 64 << 10, 1 << 20} {
		rounds := 20
		if size == 1<<20 {
			rounds = 3
		}
		if err := slotPingPongs(ctx, c, 16, rounds, size); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		st, err := c.ClientStreaming(ctx, "count")
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := st.SendRaw(pattern(size, 3)); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := st.CloseAndRecvRaw(); err != nil || string(out) != fmt.Sprint(3*size) {
			t.Fatalf("count of 3 × %d bytes: %q %v", size, out, err)
		}
	}
	if n := streamSlotCalls.Load() - before; n < 4*17 {
		t.Fatalf("%d calls in stream slots, want all %d", n, 4*17)
	}
	waitFor(t, "every slot free and every payload slot released", func() bool {
		st := c.ShmStats()
		return freeSlots(x) == shm.CallSlots && st.InUse == 0
	})
}

// TestShmStreamsInterop: a peer without shm_streams (an older Go, Node or
// Python peer), either side: bidi and client-streaming calls work on the
// socket, unary calls still use call slots.
func TestShmStreamsInterop(t *testing.T) {
	for _, tc := range []struct {
		name           string
		srvOff, cliOff bool
	}{{"old server", true, false}, {"old client", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := sumServer()
			s.opts.noShmStreams = tc.srvOff
			addr := startServer(t, s)
			c, x := slotClientOpts(t, addr, ClientOptions{noShmStreams: tc.cliOff})
			if x.streams != nil {
				t.Fatal("stream slots in use with a peer that lacks bit 5")
			}
			before, unary := streamSlotCalls.Load(), c.slotCallCount()
			st, err := OpenJSONBidi[int, int](context.Background(), c, "sum")
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []int{1, 3, 6} {
				st.Send(i + 1)
				if got, err := st.Recv(); err != nil || got != want {
					t.Fatalf("sum: %d %v, want %d", got, err, want)
				}
			}
			st.CloseSend()
			if _, err := st.Recv(); err != io.EOF {
				t.Fatal(err)
			}
			echoes(t, c, 3, 64)
			if streamSlotCalls.Load() != before {
				t.Fatal("a call went through a stream slot")
			}
			if c.slotCallCount() != unary+3 {
				t.Fatalf("%d unary calls through call slots, want 3", c.slotCallCount()-unary)
			}
		})
	}
}

// TestShmStreamsServerKilled: kill -9 of the server while a stream-slot
// call's Recv waits: it fails at once with unavailable, and nothing stays
// mapped.
func TestShmStreamsServerKilled(t *testing.T) {
	_, _, devBefore := shmTraces(t)
	addr := "unix:" + filepath.Join(t.TempDir(), "k.sock")
	srv := startHelper(t, "server", addr, "ready")
	c, _ := slotClient(t, addr)
	before := streamSlotCalls.Load()
	st, err := OpenJSONBidi[int, int](context.Background(), c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	st.Send(5)
	if got, err := st.Recv(); err != nil || got != 5 {
		t.Fatalf("sum: %d %v", got, err)
	}
	if streamSlotCalls.Load() == before {
		t.Fatal("the call is not in a stream slot")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := st.Recv() // the server sends nothing more
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	killServerMidCall(t, srv, errc)
	if err := st.Send(1); CodeOf(err) != Unavailable {
		t.Fatalf("Send after the kill: %v", err)
	}
	c.Close()
	waitNoTraces(t, devBefore)
}

// connErr is the error c's (one) connection ended with, nil while it lives.
func connErr(c *Client) error {
	cc := c.slots[0].cur.Load()
	if cc == nil {
		return nil
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err == nil {
		return nil
	}
	return cc.err
}

// TestShmStreamsNoLeaks: 200 connections that each run stream-slot calls,
// one left open and one canceled mid-call, then close: no goroutine,
// descriptor or mapping is left behind on either side.
var leakRounds = 200

func TestShmStreamsNoLeaks(t *testing.T) {
	_, _, devBefore := shmTraces(t)
	func() {
		s, addr := streamServer(t)
		defer s.Close()
		for i := range leakRounds {
			c, _ := slotClient(t, addr)
			if err := slotPingPongs(context.Background(), c, 2, 3, 1024); err != nil {
				t.Fatalf("%v (the connection ended with %v)", err, connErr(c))
			}
			open, err := c.Bidi(context.Background(), "bidi-echo")
			if err != nil {
				t.Fatalf("%v (the connection ended with %v)", err, connErr(c))
			}
			open.SendRaw([]byte{byte(i)})
			ctx, cancel := context.WithCancel(context.Background())
			held, err := c.Bidi(ctx, "hold")
			if err != nil {
				t.Fatalf("%v (the connection ended with %v)", err, connErr(c))
			}
			cancel()
			if _, err := held.RecvRaw(); CodeOf(err) != Canceled {
				t.Fatalf("canceled call: %v", err)
			}
			c.Close()
			if _, err := open.RecvRaw(); err == nil {
				// its echo may have come before the close
				if _, err := open.RecvRaw(); err == nil {
					t.Fatal("a call open on a closed client still receives")
				}
			}
		}
	}()
	checkNoLeaks(t)
	waitNoTraces(t, devBefore)
}

// TestShmStreamsEndRacesSend: handlers that end their call after one item
// while the client keeps sending: Send stops with the call's outcome, the
// frame the client published racing with the end is dropped by the server
// (ans_seq follows it), and every slot comes back to serve unary and
// stream calls.
func TestShmStreamsEndRacesSend(t *testing.T) {
	s, addr := streamServer(t)
	s.HandleRawBidi("one", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		if _, err := recv(); err != nil {
			return err
		}
		return send([]byte("bye"))
	})
	c, x := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	late := lateFrames.Load()
	defer func() { t.Logf("%d frames raced with their call's end and were dropped", lateFrames.Load()-late) }()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			for r := range 20 {
				st, err := c.Bidi(ctx, "one")
				if err != nil {
					errs <- err
					return
				}
				var sendErr error
				for i := 0; sendErr == nil; i++ { // until the end is in (bounded by ctx)
					sendErr = st.SendRaw([]byte{byte(g), byte(r), byte(i)})
				}
				if sendErr != io.EOF {
					errs <- fmt.Errorf("caller %d call %d: Send after the end: %v, want io.EOF", g, r, sendErr)
					return
				}
				if it, err := st.RecvRaw(); err != nil || string(it) != "bye" {
					errs <- fmt.Errorf("caller %d call %d: %q %v", g, r, it, err)
					return
				}
				if _, err := st.RecvRaw(); err != io.EOF {
					errs <- fmt.Errorf("caller %d call %d end: %v", g, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, "every slot free", func() bool { return freeSlots(x) == shm.CallSlots })
	echoes(t, c, 40, 1024)
	if err := slotPingPongs(ctx, c, 32, 5, 1024); err != nil {
		t.Fatal(err)
	}
}

// TestShmStreamsIdlePollerNaps: a bidi call in a stream slot that waits
// for its next item leaves the client's poller asleep on cbell; after
// idleNaps empty naps it sleeps shmIdleNap at a time (5 naps a second, not
// 100: an idle call cost 6-10 % of a core before), and an item published
// meanwhile still wakes it at once (numbered sleeps lose no honest wake:
// with the wake lost, an item would wait half a long nap, 100 ms, on
// average).
func TestShmStreamsIdlePollerNaps(t *testing.T) {
	_, addr := streamServer(t)
	c, _ := slotClient(t, addr)
	st, err := c.Bidi(context.Background(), "bidi-echo")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.slot == nil {
		t.Fatal("the call did not open in a stream slot")
	}
	var echoes []time.Duration
	for range 5 {
		time.Sleep(pollerIdleAfter())
		n0, _ := c.slotNaps()
		time.Sleep(time.Second)
		n1, _ := c.slotNaps()
		t.Logf("naps in an idle second: %d", n1-n0)
		if d := n1 - n0; d > 20 {
			t.Fatalf("the idle poller napped %d times in 1 s; want about %d (one per %v)", d, time.Second/shmIdleNap, shmIdleNap)
		}
		t0 := time.Now()
		if err := st.SendRaw([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if it, err := st.RecvRawView(); err != nil || string(it) != "x" {
			t.Fatalf("echo: %q %v", it, err)
		}
		echoes = append(echoes, time.Since(t0))
	}
	slices.Sort(echoes)
	t.Logf("echoes after an idle second: %v", echoes)
	if echoes[len(echoes)/2] > 50*time.Millisecond {
		t.Fatalf("the median echo after an idle second took %v: a wake was lost (the poller's long nap is %v)", echoes[len(echoes)/2], shmIdleNap)
	}
}

// pollerIdleAfter is how long a poller takes to reach its long naps, with
// room for a loaded machine.
func pollerIdleAfter() time.Duration { return 3 * idleNaps * shmCallNap }

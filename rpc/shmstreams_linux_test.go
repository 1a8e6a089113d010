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

func TestShmStreamsHalfClose(t *testing.T)         { bothWays(t, TestBidiHalfCloseServerKeepsSending) }
func TestShmStreamsThousand(t *testing.T)          { bothWays(t, TestBidiThousandConcurrent) }
func TestShmStreamsCancelFromClient(t *testing.T)  { bothWays(t, TestBidiCancelFromClient) }
func TestShmStreamsServerEndsCall(t *testing.T)    { bothWays(t, TestBidiServerEndsCall) }
func TestShmStreamsDeadline(t *testing.T)          { bothWays(t, TestBidiDeadline) }
func TestShmStreamsHandlerStops(t *testing.T)      { bothWays(t, TestBidiHandlerStopsReading) }
func TestShmStreamsClientStops(t *testing.T)       { bothWays(t, TestBidiClientStopsReading) }
func TestShmStreamsKindMismatch(t *testing.T)      { bothWays(t, TestBidiKindMismatch) }
func TestShmStreamsInterceptors(t *testing.T)      { bothWays(t, TestBidiInterceptors) }
func TestShmStreamsMetadata(t *testing.T)          { bothWays(t, TestBidiMetadata) }
func TestShmStreamsDrain(t *testing.T)             { bothWays(t, TestBidiDrain) }

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

func bidiEchoServer(t *testing.T) (*Server, string) {
	s := echoServer()
	s.HandleRawBidiView("bidi-echo", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := send(it); err != nil {
				return err
			}
		}
	})
	return s, startServer(t, s)
}

func TestShmStreamsPingPongProbe(t *testing.T) {
	_, addr := bidiEchoServer(t)
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
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Streams struct {
			Open   []streamFrameVec `json:"open_frames"`
			Client []streamFrameVec `json:"client_frames"`
			Server []streamFrameVec `json:"server_frames"`
		}
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	s := v.Streams
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
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		f.Fatal(err)
	}
	var v struct {
		Streams struct {
			Open   []streamFrameVec `json:"open_frames"`
			Client []streamFrameVec `json:"client_frames"`
			Server []streamFrameVec `json:"server_frames"`
		}
	}
	if err := json.Unmarshal(b, &v); err != nil {
		f.Fatal(err)
	}
	for _, vs := range [][]streamFrameVec{v.Streams.Open, v.Streams.Client, v.Streams.Server} {
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

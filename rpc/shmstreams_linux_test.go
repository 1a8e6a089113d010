package rpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
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

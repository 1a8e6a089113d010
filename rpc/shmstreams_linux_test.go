package rpc

import (
	"testing"
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

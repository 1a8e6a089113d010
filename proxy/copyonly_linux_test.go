package proxy

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"
)

// TestCopyOnlyDirectionMixedSizes drives the unix -> tcp direction (copied,
// not spliced) with small messages and bursts in turn, so its read buffer
// grows to the bulk size and shrinks back several times; every byte must
// arrive in order.
func TestCopyOnlyDirectionMixedSizes(t *testing.T) {
	a1, a2 := unixPair(t)
	b1, b2 := tcpPair(t)
	done := make(chan JoinResult, 1)
	go func() { done <- Join(context.Background(), a2, b1, JoinOptions{}) }()

	sentc := make(chan []byte, 1)
	sizes := []int{100, 300 << 10, 5, 64 << 10, 1, 1 << 20, 700, 40 << 10}
	data := randomBytes(1 << 21)
	go func() {
		var sent bytes.Buffer
		defer func() { sentc <- sent.Bytes() }()
		off := 0
		for round := range 3 {
			for _, n := range sizes {
				chunk := data[off%len(data):][:min(n, len(data)-off%len(data))]
				off += len(chunk)
				sent.Write(chunk)
				if _, err := a1.Write(chunk); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				if n < 1024 {
					// Let the small write arrive on its own.
					time.Sleep(time.Duration(1+round) * time.Millisecond)
				}
			}
		}
		a1.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(b2)
	if err != nil {
		t.Fatal(err)
	}
	b2.Close()
	res := <-done
	sent := <-sentc
	if !bytes.Equal(got, sent) {
		t.Fatalf("got %d bytes, sent %d; equal prefix %d", len(got), len(sent), commonPrefix(got, sent))
	}
	if res.SplicedAtoB || res.AtoB != int64(len(sent)) {
		t.Fatalf("result %+v, want unix -> tcp copied and %d bytes", res, len(sent))
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

package bench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// hangCaller answers until request hangAt, which never gets an answer: it
// returns only when its ctx ends (ctxAware) or its client is closed.
type hangCaller struct {
	n        int
	hangAt   int
	ctxAware bool
	closed   <-chan struct{}
}

func (h *hangCaller) Call(ctx context.Context, p []byte) ([]byte, error) {
	h.n++
	if h.n < h.hangAt {
		return p, nil
	}
	if h.ctxAware {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-h.closed:
			return nil, errors.New("use of closed connection")
		}
	}
	<-h.closed // like a read on a plain net.Conn: only Close ends it
	return nil, errors.New("use of closed connection")
}

// A request that never completes fails the sample with ErrStalled shortly
// after the time cap, for callers that honour ctx and for callers that only
// stop when their connection is closed, instead of hanging the run forever.
func TestMeasureFailsOnAStalledRequest(t *testing.T) {
	old := stallGrace
	stallGrace = 200 * time.Millisecond
	defer func() { stallGrace = old }()
	noStats := func() (Stats, error) { return Stats{}, nil }
	for _, ctxAware := range []bool{true, false} {
		closed := make(chan struct{})
		var once sync.Once
		cl := &Client{
			Callers: []Caller{&hangCaller{hangAt: 5, ctxAware: ctxAware, closed: closed}},
			Close:   func() error { once.Do(func() { close(closed) }); return nil },
		}
		type result struct {
			s   *sample
			err error
		}
		done := make(chan result, 1)
		t0 := time.Now()
		go func() {
			s, err := measure(context.Background(), cl, noStats, Payload(16), 100, 0, 100*time.Millisecond)
			done <- result{s, err}
		}()
		select {
		case r := <-done:
			if !errors.Is(r.err, ErrStalled) || !strings.Contains(r.err.Error(), "no answer") {
				t.Fatalf("ctxAware=%v: got %v, want ErrStalled", ctxAware, r.err)
			}
			if el := time.Since(t0); el < 300*time.Millisecond {
				t.Errorf("ctxAware=%v: gave up after %v, before the cap plus grace (300ms)", ctxAware, el)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ctxAware=%v: measure still hangs 10s after the time cap", ctxAware)
		}
	}
}

package handoff

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// BenchmarkHandoff hands one socket back and forth inside one process:
// acquire, take the listener, serve, commit, and offer it on in turn. The
// serving metric is the handoff time (acquire -> accepting) without process
// start-up or other load; ns/op is a whole cycle, offer set-up included.
func BenchmarkHandoff(b *testing.B) {
	dir := testutil.ShortDir(b, 0o700)
	path := filepath.Join(dir, "b.sock")
	ctl := ControlPath(path)
	ctx := context.Background()
	l, err := Listen(ctx, "svc", path, uds.ListenOptions{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	testutil.Serve(b, l, testutil.Hangup)
	off, err := Offer(ctx, []*Listener{l}, OfferOptions{Control: ctl, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	var serving time.Duration
	for b.Loop() {
		a, err := Acquire(ctx, ctl, AcquireOptions{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		nl, err := a.Listener("svc", uds.ListenOptions{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		testutil.Serve(b, nl, testutil.Hangup)
		s, err := a.Commit(ctx)
		if err != nil {
			b.Fatal(err)
		}
		serving += s
		<-off.Committed()
		off.Close()
		l.Close()
		if off, err = Offer(ctx, []*Listener{nl}, OfferOptions{Control: ctl, Logger: quiet}); err != nil {
			b.Fatal(err)
		}
		l = nl
	}
	b.ReportMetric(float64(serving.Microseconds())/float64(b.N), "µs-serving/op")
	off.Close()
	l.Close()
}

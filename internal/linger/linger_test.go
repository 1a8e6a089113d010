package linger

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A connection that comes back within Quiet of the count touching zero
// keeps the wait going; the wait ends Quiet after the count last went to
// zero.
func TestWaitNeedsQuiet(t *testing.T) {
	var n atomic.Int64
	n.Store(1)
	done := make(chan time.Time, 1)
	go func() {
		if err := Wait(context.Background(), 0, func() int { return int(n.Load()) }); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	}()
	time.Sleep(50 * time.Millisecond)
	n.Store(0) // the app closes ...
	time.Sleep(Quiet / 3)
	n.Store(1) // ... and reconnects at once
	time.Sleep(Quiet * 2)
	select {
	case <-done:
		t.Fatal("Wait ended although a connection came back within Quiet")
	default:
	}
	n.Store(0)
	last := time.Now()
	select {
	case end := <-done:
		if d := end.Sub(last); d < Quiet || d > Quiet+500*time.Millisecond {
			t.Errorf("Wait ended %v after the count went to zero; want just after %v", d, Quiet)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not end with no connection")
	}
}

func TestWaitMinGraceAndCtx(t *testing.T) {
	start := time.Now()
	if err := Wait(context.Background(), 300*time.Millisecond, func() int { return 0 }); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 300*time.Millisecond+Quiet {
		t.Errorf("Wait with no connection ended after %v, before the 300ms grace and Quiet", el)
	}
	for _, grace := range []time.Duration{0, time.Minute} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start = time.Now()
		err := Wait(ctx, grace, func() int { return 1 })
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Errorf("grace %v: Wait = %v after %v; want the ctx's deadline", grace, err, time.Since(start))
		}
	}
}

package linger

import (
	"context"
	"time"
)

// Quiet is how long no connection may be open before the wait ends.
const Quiet = 250 * time.Millisecond

// tick is how often the connection count is looked at.
const tick = 10 * time.Millisecond

// Wait returns nil once minGrace has passed and active() has been 0 for
// Quiet, or ctx's error when ctx ends first.
func Wait(ctx context.Context, minGrace time.Duration, active func() int) error {
	if minGrace > 0 {
		t := time.NewTimer(minGrace)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var idleSince time.Time
	for {
		if active() > 0 {
			idleSince = time.Time{}
		} else if idleSince.IsZero() {
			idleSince = time.Now()
		} else if time.Since(idleSince) >= Quiet {
			return nil
		}
		select {
		case <-tk.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

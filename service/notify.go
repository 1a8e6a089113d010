package service

import (
	"context"
	"os"
	"os/signal"
	"sync"
)

// NotifyContext returns a copy of ctx that ends at the first of Signals
// (SIGPIPE only when stdout or stderr lost its reader, as in Run), for a
// command that just stops, with no drain: `udskit capture --kernel`, a
// benchmark. stop releases the signals, as signal.NotifyContext's does.
func NotifyContext(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	raw := make(chan os.Signal, 2)
	signal.Notify(raw, Signals...)
	sigs := make(chan os.Signal, 1)
	quit := make(chan struct{})
	go filterSignals(raw, sigs, quit, stdioBroken)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(raw)
			close(quit)
			cancel()
		})
	}
}

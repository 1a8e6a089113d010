package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Serve accepts conns on l until it is closed and runs handle on each in its
// own goroutine, closing the conn when handle returns. In t.Cleanup it closes
// l and every open conn and waits for all its goroutines, so nothing it
// started outlives the test.
func Serve(t testing.TB, l net.Listener, handle func(net.Conn)) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open = map[net.Conn]struct{}{}
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
				c.Close()
				mu.Lock()
				delete(open, c)
				mu.Unlock()
			}()
		}
	}()
}

// Echo writes back what it reads until EOF.
func Echo(c net.Conn) { io.Copy(c, c) }

// Discard reads and drops everything until EOF: a server that never answers.
func Discard(c net.Conn) { io.Copy(io.Discard, c) }

// Hangup closes the conn at once.
func Hangup(net.Conn) {}

// Greet returns a handler that sends greeting first, then reads and drops
// everything until EOF.
func Greet(greeting []byte) func(net.Conn) {
	return func(c net.Conn) {
		c.Write(greeting)
		io.Copy(io.Discard, c)
	}
}

// Workers runs n goroutines, each calling fn(g, i) for i = 0, 1, ... until
// fn returns false, max calls are made, or d has passed; it returns when all
// have stopped. It is the bounded load loop of chaos and stress tests.
func Workers(n int, d time.Duration, max int, fn func(g, i int) bool) {
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; i < max && time.Now().Before(deadline); i++ {
				if !fn(g, i) {
					return
				}
			}
		})
	}
	wg.Wait()
}

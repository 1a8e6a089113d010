package rpc

import (
	"context"
	"testing"
	"time"
)

// TestShmCallsOneConn: a client with ShmCalls and the default pool (Conns
// and ShmConns 2) keeps 16 callers of 64 B and of 64 KiB on its first
// connection while that has a free call slot (Client.limit,
// clientCalls.keeps): every call goes through a slot and no second
// connection is opened. With 48 callers (more than the 32 slots: slot calls
// and socket calls on one connection at once, where the poller and the
// socket reader once shared their handler contexts) every echo is still
// right.
func TestShmCallsOneConn(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	c := dialOpts(t, addr, ClientOptions{ShmCalls: true, NoReconnect: true})
	if cc := c.slots[0].cur.Load(); cc == nil || cc.slotCalls == nil {
		t.Fatal("the connection did not negotiate call slots")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(callers, rounds int) error {
		return echoRounds(ctx, c, callers, rounds, 131, 64, 40<<10, 64<<10)
	}
	const callers, rounds = 16, 40
	if err := run(callers, rounds); err != nil {
		t.Fatal(err)
	}
	if got, want := c.slotCallCount(), uint64(callers*rounds*3); got != want {
		t.Fatalf("%d calls through call slots, want %d", got, want)
	}
	c.mu.Lock()
	live := len(c.live)
	c.mu.Unlock()
	if live != 1 {
		t.Fatalf("16 callers with 32 call slots free opened %d connections, want 1", live)
	}
	if err := run(48, 5); err != nil {
		t.Fatal(err)
	}
}

package rpc

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
)

// countingListener counts accepted connections and, past limit (if > 0),
// closes them at once, as a server at its connection limit does.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
	limit    int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.accepted.Add(1); l.limit > 0 && n > l.limit {
			c.Close()
			continue
		}
		return c, nil
	}
}

// poolServer serves s behind a countingListener and returns its address.
func poolServer(t *testing.T, s *Server, limit int32) (string, *countingListener) {
	t.Helper()
	var cl *countingListener
	addr := serveWrapped(t, s, func(l net.Listener) net.Listener {
		cl = &countingListener{Listener: l, limit: limit}
		return cl
	})
	return addr, cl
}

// holdServer is an echo server whose "hold" method answers once release is
// closed; held counts the calls waiting there.
func holdServer(release chan struct{}, held *atomic.Int32) *Server {
	s := echoServer()
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		held.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	return s
}

// callConcurrently makes n concurrent "hold" calls with requests of size
// bytes and returns a func that waits for them and reports the first failure.
func callConcurrently(c *Client, n, size int) func() error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p := fmt.Append(make([]byte, 0, size), i)
			p = append(p, make([]byte, max(0, size-len(p)))...)
			out, err := c.CallRaw(ctx, "hold", p, nil)
			if err == nil && string(out) != string(p) {
				err = fmt.Errorf("call %d: got %q", i, out)
			}
			errs <- err
		})
	}
	return func() error {
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// TestPoolLoneCallerUsesOneConnection: calls made one at a time never open a
// second connection.
func TestPoolLoneCallerUsesOneConnection(t *testing.T) {
	addr, l := poolServer(t, echoServer(), 0)
	c := dial(t, addr)
	for i := range 300 {
		if _, err := c.CallRaw(context.Background(), "echo", []byte{byte(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.accepted.Load(); n != 1 {
		t.Fatalf("a lone caller opened %d connections, want 1", n)
	}
}

// TestPoolGrowsWhenBusy: with every connection busy the client opens another,
// up to Conns for small calls and LargeConns for large ones (a request of
// 32 KiB or more), or ShmConns for large ones that travel in the shared
// region (on by default here, on Linux), and the calls spread over them.
func TestPoolGrowsWhenBusy(t *testing.T) {
	// Callers arrive one at a time, each held: every second one finds all
	// connections busy and grows the pool (it goes to a busy one meanwhile;
	// the next finds the new one idle), so n callers open 1 + n/2, up to
	// the limit.
	cases := []struct {
		name    string
		opts    ClientOptions
		size    int // request bytes
		callers int
		limit   int
	}{
		{"conns=1", ClientOptions{Conns: 1}, 1, 12, 1},
		{"conns=default", ClientOptions{}, 1, 12, DefaultConns},
		{"conns=3", ClientOptions{Conns: 3}, 1, 12, 3},
		{"large calls", ClientOptions{NoShm: true}, frame.DefaultLargePayload, 12, DefaultLargeConns},
		{"large calls: up to DefaultLargeConns", ClientOptions{NoShm: true}, frame.DefaultLargePayload, 2*DefaultLargeConns + 2, DefaultLargeConns},
		{"large calls: Conns set, LargeConns not", ClientOptions{Conns: 3, NoShm: true}, frame.DefaultLargePayload, 12, 3},
		{"large calls: LargeConns set", ClientOptions{LargeConns: 5, NoShm: true}, frame.DefaultLargePayload, 12, 5},
		{"just under large", ClientOptions{}, frame.DefaultLargePayload - 1, 12, DefaultConns},
		// With shared memory (the rule for large calls whose request goes
		// in the region: ShmConns).
		{"shm large calls: up to DefaultShmConns", ClientOptions{}, frame.DefaultLargePayload, 12, DefaultShmConns},
		{"shm large calls: ShmConns set", ClientOptions{ShmConns: 4}, frame.DefaultLargePayload, 12, 4},
		{"shm large calls: ShmConns 1", ClientOptions{ShmConns: 1}, frame.DefaultLargePayload, 12, 1},
		{"shm large calls: ShmConns over LargeConns", ClientOptions{ShmConns: 20}, frame.DefaultLargePayload, 2*20 + 2, 20},
		{"shm large calls: Conns set, LargeConns not", ClientOptions{Conns: 3}, frame.DefaultLargePayload, 12, 3},
		{"shm large calls: LargeConns set", ClientOptions{LargeConns: 5}, frame.DefaultLargePayload, 12, 5},
		{"shm small calls keep to Conns", ClientOptions{ShmConns: 4}, frame.DefaultLargePayload - 1, 12, DefaultConns},
		{"shm large calls on the socket: LargeConns", ClientOptions{ShmThreshold: 2 * frame.DefaultLargePayload}, frame.DefaultLargePayload, 12, DefaultLargeConns},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var held atomic.Int32
			addr, l := poolServer(t, holdServer(release, &held), 0)
			c, err := Dial(context.Background(), addr, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Start callers one after another, each once the previous is
			// held and any dial it started is done: the second finds the
			// pool busy and grows it, the third finds the new connection
			// idle, the fourth grows the pool again, and so on up to the
			// limit.
			var waits []func() error
			for i := range tc.callers {
				waits = append(waits, callConcurrently(c, 1, tc.size))
				testutil.WaitFor(t, "call held", func() bool { return held.Load() == int32(i+1) })
				testutil.WaitFor(t, "pooled dial done", func() bool { return !c.growing.Load() })
			}
			if shmOn := c.ShmStats().Conns > 0; shmOn == tc.opts.NoShm || strings.HasPrefix(tc.name, "shm ") && !shmOn {
				t.Fatalf("shared memory in use: %v, NoShm: %v", shmOn, tc.opts.NoShm)
			}
			want := min(tc.limit, 1+tc.callers/2)
			if n := l.accepted.Load(); n != int32(want) {
				t.Errorf("%d busy callers: the client opened %d connections, want %d", tc.callers, n, want)
			}
			inFlight, idle := 0, 0
			for i := range c.slots {
				if cc := c.slots[i].cur.Load(); cc != nil {
					if cc.inflight.Load() == 0 {
						idle++
					}
					inFlight += int(cc.inflight.Load())
				}
			}
			// Below the limit, the connection the last caller opened is
			// still idle; at the limit, every one has calls.
			if wantIdle := min(1, tc.limit-want); idle != wantIdle {
				t.Errorf("%d connections without a call in flight, want %d: the calls did not spread", idle, wantIdle)
			}
			if inFlight != tc.callers {
				t.Errorf("%d calls in flight over the pool, want %d", inFlight, tc.callers)
			}
			close(release)
			for _, wait := range waits {
				if err := wait(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestPoolGrowthFailureBacksOff: when the server refuses a second connection
// the calls go on over the first, and the client does not retry the dial on
// every call.
func TestPoolGrowthFailureBacksOff(t *testing.T) {
	addr, l := poolServer(t, echoServer(), 1)
	c, err := Dial(context.Background(), addr, ClientOptions{Conns: 4, MaxBackoff: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 8 {
		wg.Go(func() {
			for j := range 200 {
				if _, err := c.CallRaw(context.Background(), "echo", []byte{byte(j)}, nil); err != nil {
					t.Error(err)
					failed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	// One connection served everything; at most one refused attempt to
	// grow (8 busy callers would otherwise dial on almost every call).
	if n := l.accepted.Load(); n > 2 {
		t.Errorf("the client dialed %d times against a server that takes one connection; want at most 2", n)
	}
}

// TestPoolCloseWhileGrowing: Close while a pooled connection is being opened
// leaves no goroutine behind and fails nothing that had succeeded.
func TestPoolCloseWhileGrowing(t *testing.T) {
	defer checkNoLeaks(t)
	release := make(chan struct{})
	var held atomic.Int32
	s := holdServer(release, &held)
	addr, _ := poolServer(t, s, 0)
	c, err := Dial(context.Background(), addr, ClientOptions{Conns: 4})
	if err != nil {
		t.Fatal(err)
	}
	wait := callConcurrently(c, 6, 1)
	testutil.WaitFor(t, "calls held", func() bool { return held.Load() >= 1 })
	c.Close()
	if err := wait(); CodeOf(err) != Canceled {
		t.Fatalf("calls in flight at Close: want Canceled, got %v", err)
	}
	close(release)
	s.Close()
}

// killingListener records accepted connections so a test can cut them all.
type killingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *killingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *killingListener) killAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// cuttingServer serves s behind a killingListener that cuts every
// connection each period, and dials a fast-reconnecting client. stop ends
// the cutting; the client is the caller's to close.
func cuttingServer(t *testing.T, s *Server, period time.Duration) (c *Client, stop func()) {
	t.Helper()
	var l *killingListener
	addr := serveWrapped(t, s, func(ul net.Listener) net.Listener {
		l = &killingListener{Listener: ul}
		return l
	})
	// WaitForReady: these tests are about calls moving off dead connections
	// onto new ones; by default (fail fast) a call that finds no connection
	// after a failed reconnect attempt fails instead (TestFailFastAfterShutdown).
	c, err := Dial(context.Background(), addr, ClientOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, WaitForReady: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var killer sync.WaitGroup
	killer.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(period):
				l.killAll()
			}
		}
	})
	return c, func() { close(done); killer.Wait() }
}

// TestCallsAcrossKilledConnections: while the server keeps cutting
// connections under concurrent callers, every call either fails at once or
// returns its own answer. Three bugs this caught: a pooled call state reused
// while a closing connection still signalled it (a later call returned at
// once, with an empty answer or a stale error); a call given the read role
// while its send failed, after which nobody read the connection (calls
// waited for their deadlines); and a connection whose write failed staying
// in use, so calls kept failing on it instead of moving to a new one.
func TestCallsAcrossKilledConnections(t *testing.T) {
	c, stop := cuttingServer(t, echoServer(), 3*time.Millisecond)
	defer c.Close()
	var good, failed atomic.Int64
	testutil.Workers(8, 400*time.Millisecond, 100_000, func(g, i int) bool {
		p := []byte(fmt.Sprint(g, "/", i))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t0 := time.Now()
		out, err := c.CallRaw(ctx, "echo", p, nil)
		cancel()
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("call %s took %v (%v): nobody read its connection", p, d, err)
			return false
		}
		switch {
		case err != nil:
			failed.Add(1)
		case string(out) != string(p):
			t.Errorf("call %s returned %q", p, out)
			return false
		default:
			good.Add(1)
		}
		return true
	})
	stop()
	t.Logf("%d calls answered, %d failed with the connection", good.Load(), failed.Load())
	// A connection lives ~3 ms here; each cut fails the calls in flight on
	// it (at most 8) and the next ones reconnect. Calls failing on a dead
	// connection over and over would outnumber the answered ones.
	if good.Load() == 0 || failed.Load() > good.Load() {
		t.Fatalf("%d answered, %d failed: calls do not move off dead connections", good.Load(), failed.Load())
	}
}

// TestChaosCallsStreamsCancels mixes, on one client, unary calls with
// deadlines short enough to cancel some of them mid-flight, streams closed
// early or read to the end, and a server that keeps cutting connections.
// Every operation ends within its deadline plus slack and is either right or
// an error, and nothing is left running after Close.
func TestChaosCallsStreamsCancels(t *testing.T) {
	defer checkNoLeaks(t)
	s := echoServer()
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-time.After(time.Duration(req[0]) * 100 * time.Microsecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := range int(req[0]) {
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	c, stop := cuttingServer(t, s, 7*time.Millisecond)
	var ops, good atomic.Int64
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		testutil.Workers(8, 500*time.Millisecond, 100_000, func(g, i int) bool {
			limit := time.Duration(1+(g*7+i)%5) * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			t0 := time.Now()
			var err error
			switch (g + i) % 3 {
			case 0: // unary, sometimes slower than its deadline
				p := []byte{byte(i % 40), byte(g)}
				var out []byte
				if out, err = c.CallRaw(ctx, "slow", p, nil); err == nil && string(out) != string(p) {
					t.Errorf("slow %v returned %v", p, out)
				}
			case 1: // a stream read to its end
				n := 1 + i%20
				var st *ClientStream
				if st, err = c.Stream(ctx, "count", []byte{byte(n)}); err == nil {
					for k := 0; ; k++ {
						it, rerr := st.RecvRaw()
						if rerr == io.EOF {
							if k != n {
								t.Errorf("stream of %d ended after %d items", n, k)
							}
							break
						}
						if rerr != nil {
							err = rerr
							break
						}
						if it[0] != byte(k) {
							t.Errorf("stream item %d is %d", k, it[0])
						}
					}
					st.Close()
				}
			case 2: // a stream abandoned after one item
				var st *ClientStream
				if st, err = c.Stream(ctx, "count", []byte{200}); err == nil {
					_, err = st.RecvRaw()
					st.Close()
				}
			}
			cancel()
			ops.Add(1)
			if err == nil {
				good.Add(1)
			}
			if d := time.Since(t0); d > limit+time.Second {
				t.Errorf("an operation with a %v deadline took %v (%v)", limit, d, err)
				return false
			}
			return true
		})
	}()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("operations stuck:\n%s", buf[:runtime.Stack(buf, true)])
	}
	stop()
	c.Close()
	s.Close()
	t.Logf("%d operations, %d succeeded", ops.Load(), good.Load())
	if good.Load() == 0 {
		t.Fatal("nothing succeeded")
	}
}

// TestPoolGrowthRetriesBackOff: against a server that keeps refusing a
// second connection, the client's attempts to open one thin out (MaxBackoff,
// then twice that, ...) instead of coming every MaxBackoff.
func TestPoolGrowthRetriesBackOff(t *testing.T) {
	addr, l := poolServer(t, echoServer(), 1)
	c, err := Dial(context.Background(), addr, ClientOptions{Conns: 2, MaxBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 4 callers, so calls overlap: the pool always wants to grow.
	testutil.Workers(4, 600*time.Millisecond, 1_000_000, func(g, i int) bool {
		if _, err := c.CallRaw(context.Background(), "echo", []byte{1}, nil); err != nil {
			t.Error(err)
			return false
		}
		return true
	})
	// Every 10 ms would be ~60 attempts; doubling (10, 20, 40, ... 640 ms)
	// gives about 6.
	if n := l.accepted.Load() - 1; n > 12 || n < 2 {
		t.Errorf("%d attempts to open a second connection in 600 ms; want a handful, backing off", n)
	}
}

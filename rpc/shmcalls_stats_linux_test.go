package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/shm"
)

// TestShmCallsStats: calls through call slots count in ShmStats and
// udskit.stats on both sides (slot_calls), payloads carried in the slots'
// payload areas count in Sent/Received with their bytes each way
// (area_sent_bytes, area_received_bytes), next to the payload slots' own;
// the server keeps the counts of closed connections.
func TestShmCallsStats(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		s := NewServer(ServerOptions{ShmInPlace: inPlace})
		s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
			return append(dst, req...), nil
		})
		addr := startServer(t, s)
		c, _ := slotClient(t, addr)
		const n = 40 // more calls than slots: each area is reused
		for _, size := range []int{64, 16 << 10, 64 << 10, 64<<10 + 1} {
			echoes(t, c, n, size) // 64 B in the slot's frame, 16 and 64 KiB in areas, 64 KiB + 1 in a payload slot
		}
		area := uint64(n * (16<<10 + 64<<10))
		cs := c.ShmStats()
		if cs.SlotCalls != 4*n || cs.AreaSentBytes != area || cs.AreaReceivedBytes != area || cs.Sent != 3*n || cs.Received != 3*n {
			t.Fatalf("in place %v: client %+v: want %d slot calls, %d area bytes each way, %d payloads each way through the region", inPlace, cs, 4*n, area, 3*n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st, err := FetchStats(ctx, c) // (counted after its answer is built: not in it)
		if err != nil {
			t.Fatal(err)
		}
		sh := st.Shm
		if sh.SlotCalls != 4*n || sh.AreaSentBytes != area || sh.AreaReceivedBytes != area || sh.Sent != 3*n || sh.Received != 3*n {
			t.Fatalf("in place %v: server stats %+v: want %d slot calls, %d area bytes each way, %d payloads each way", inPlace, sh, 4*n, area, 3*n)
		}
		raw, err := c.CallRaw(ctx, StatsMethod, nil, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var wire struct {
			Shm map[string]any `json:"shm"`
		}
		if err := json.Unmarshal(raw, &wire); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"slot_calls", "area_sent_bytes", "area_received_bytes", "spurious_wakes"} {
			if _, ok := wire.Shm[k]; !ok {
				t.Fatalf("%s answer %s lacks shm.%s", StatsMethod, raw, k)
			}
		}
		if wire.Shm["area_received_bytes"] != float64(area) {
			t.Fatalf("%s answer %s: area_received_bytes want %d", StatsMethod, raw, area)
		}
		c.Close()
		st = statsEventually(t, s, "the connection to close", func(st ServerStats) bool { return st.Conns == 0 })
		if sh := st.Shm; sh.SlotCalls < 4*n || sh.AreaSentBytes != area || sh.AreaReceivedBytes != area {
			t.Fatalf("in place %v: after close %+v: the call-slot counters are not kept", inPlace, sh)
		}
	}
}

// TestShmCallsLoneSpinAdapts: a lone caller whose handler always takes a
// millisecond stops spinning for its answer (at most 1 call in 10 spins,
// instead of every call spending loneSpin). That 64 B echoes still spin
// is TestLoneSpinPolicy's: whether their answers come within the spin
// depends on the machine's load (under -race on a loaded machine even the
// old always-spinning caller found few in it).
func TestShmCallsLoneSpinAdapts(t *testing.T) {
	s := echoServer()
	s.HandleRaw("nap", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		time.Sleep(time.Millisecond)
		return append(dst, req...), nil
	})
	c, x := slotClient(t, startServer(t, s))
	echoes(t, c, 20, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const slow = 200
	before := x.spin.spins.Load()
	for i := range slow {
		if _, err := c.CallRaw(ctx, "nap", pattern(64, i), nil); err != nil {
			t.Fatal(err)
		}
	}
	spins := x.spin.spins.Load() - before
	t.Logf("slow handler: %d spins in %d lone calls", spins, slow)
	if spins > slow/10 { // (loneSpinMisses, then a probe every loneSpinProbe calls: 10, more if a spin's Gosched outlasts the handler)
		t.Fatalf("slow handler: a lone caller spun on %d of %d calls, want at most %d", spins, slow, slow/10)
	}
	if m := x.spin.miss.Load(); m < loneSpinMisses {
		t.Fatalf("slow handler: spinning still on (%d misses)", m)
	}
	before = x.spin.skips.Load()
	echoes(t, c, 100, 64)
	t.Logf("then 100 echoes of 64 B: %d did not spin", x.spin.skips.Load()-before)
}

// TestLoneSpinPolicy: the lone caller's spin, answer by answer. Answers
// that come within the spin keep every lone call spinning loneSpin;
// loneSpinMisses in a row that do not turn it off but for one probe of loneProbeSpin
// every loneSpinProbe lone calls; an answer found in the first looks or
// by a probe turns it back on; a caller that is not alone never spins.
func TestLoneSpinPolicy(t *testing.T) {
	x := &clientCalls{}
	x.wait.Store(1) // (spun runs while the caller still counts as waiting)
	for i := range 100 {
		if w := x.spinFor(true, false); w != loneSpin {
			t.Fatalf("fast answers, call %d: spin %v, want %v", i, w, loneSpin)
		}
		x.spun(true)
	}
	spins, probes := 0, 0
	const slow = 320
	for i := range slow {
		w := x.spinFor(true, false)
		switch {
		case w == loneProbeSpin:
			probes++
		case w == loneSpin:
			spins++
		case w != 0:
			t.Fatalf("slow answers, call %d: spin %v", i, w)
		}
		if w > 0 {
			x.spun(false)
		}
	}
	if spins != loneSpinMisses || probes != (slow-1)/loneSpinProbe { // (probes at 32, 64, ... lone calls since the last answer in time)
		t.Fatalf("slow answers: %d spins and %d probes in %d calls, want %d and %d", spins, probes, slow, loneSpinMisses, (slow-1)/loneSpinProbe)
	}
	if w := x.spinFor(false, false); w != 0 {
		t.Fatalf("a caller that is not alone spins %v", w)
	}
	if w := x.spinFor(true, true); w != 0 { // its answer was in at the first looks
		t.Fatalf("an answer already in: spin %v", w)
	}
	if w := x.spinFor(true, false); w != loneSpin {
		t.Fatalf("after an answer in the first looks: spin %v, want %v", w, loneSpin)
	}
	for i := 0; ; i++ { // slow again, until the probe
		w := x.spinFor(true, false)
		if w == loneProbeSpin {
			break
		}
		if i > loneSpinMisses+loneSpinProbe {
			t.Fatalf("no probe in %d slow calls", i)
		}
		if w > 0 {
			x.spun(false)
		}
	}
	x.spun(true) // a probe found its answer
	if w := x.spinFor(true, false); w != loneSpin {
		t.Fatalf("after a probe found its answer: spin %v, want %v", w, loneSpin)
	}
}

// flood calls FutexWake on word (as a hostile peer would, holding the
// region mapped) until stop is closed or the region is gone; it returns
// the wakes it made.
func flood(r *shm.Region, word *atomic.Uint32, stop <-chan struct{}) int {
	n := 0
	for {
		select {
		case <-stop:
			return n
		default:
		}
		if !r.Acquire() {
			return n
		}
		for range 256 {
			shm.FutexWake(word, 1)
		}
		r.Release()
		n += 256
	}
}

// TestShmCallsWakeFlood: a peer flooding FUTEX_WAKE on the words the
// other side sleeps on (a client on the server poller's bell, a server on
// the client poller's cbell, or, without shm_calls_bell, on a sleeping
// caller's ans_seq) has its own connection ended with
// protocol_violation once past the bound (spuriousBurst, then
// spuriousRate a second); the wake-ups are counted (spurious_wakes), and
// another client keeps echoing all along.
func TestShmCallsWakeFlood(t *testing.T) {
	s, addr, entered := slotServer(t)
	good, _ := slotClient(t, addr)
	slowInFlight := func(t *testing.T, c *Client, n int) {
		for range n {
			go c.CallRaw(context.Background(), "slow", nil, nil)
		}
		for range n {
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the slow call did not arrive")
			}
		}
	}
	for _, tc := range []struct {
		name   string
		noBell bool
		flood  func(t *testing.T, c *Client, x *clientCalls) (*shm.Region, *atomic.Uint32)
	}{
		{"client floods the server's bell", false, func(t *testing.T, c *Client, x *clientCalls) (*shm.Region, *atomic.Uint32) {
			return x.cs.region, x.calls.Bell()
		}},
		{"server floods the client poller's cbell", false, func(t *testing.T, c *Client, x *clientCalls) (*shm.Region, *atomic.Uint32) {
			if !x.bell {
				t.Fatal("the connection did not negotiate shm_calls_bell")
			}
			slowInFlight(t, c, 2) // (two callers wait, so they park and the poller sleeps on cbell; a lone one sleeps on its own word)
			waitFor(t, "the poller to sleep on cbell", func() bool { return x.calls.CSleeping().Load() != 0 })
			return x.cs.region, x.calls.CBell()
		}},
		{"server floods a sleeping caller (no shm_calls_bell)", true, func(t *testing.T, c *Client, x *clientCalls) (*shm.Region, *atomic.Uint32) {
			if x.bell {
				t.Fatal("the connection negotiated shm_calls_bell")
			}
			slowInFlight(t, c, 1)
			for k := range shm.CallSlots {
				if x.calls.ReqSeq(k).Load() != x.calls.AnsSeq(k).Load() {
					return x.cs.region, x.calls.AnsSeq(k)
				}
			}
			t.Fatal("no slot in flight")
			return nil, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, x := slotClientOpts(t, addr, ClientOptions{noCallsBell: tc.noBell})
			echoes(t, c, 3, 64)
			sBefore, cBefore := s.Stats().Shm.SpuriousWakes, x.cs.spurious.Load()
			r, word := tc.flood(t, c, x)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			var good64 atomic.Int64
			goodErr := make(chan error, 1)
			go func() {
				defer wg.Done()
				flood(r, word, stop)
			}()
			go func() { // the other client keeps echoing meanwhile
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					req := pattern(64<<10, i)
					resp, err := good.CallRaw(ctx, "echo", req, nil)
					if err != nil || !bytes.Equal(resp, req) {
						goodErr <- fmt.Errorf("the other client's echo %d: %v (equal %v)", i, err, bytes.Equal(resp, req))
						return
					}
					good64.Add(1)
				}
			}()
			t0 := time.Now()
			cc := c.slots[0].cur.Load()
			var e *Error
			for e == nil && time.Since(t0) < 60*time.Second { // (a flood at 2x the rate passes the bound in 10 s)
				time.Sleep(5 * time.Millisecond)
				cc.mu.Lock()
				e = cc.err
				cc.mu.Unlock()
			}
			d := time.Since(t0)
			close(stop)
			wg.Wait()
			sN, cN := s.Stats().Shm.SpuriousWakes-sBefore, x.cs.spurious.Load()-cBefore
			t.Logf("ended after %v: %d spurious wake-ups counted by the server, %d by the client; the other client echoed %d times meanwhile", d.Round(time.Millisecond), sN, cN, good64.Load())
			if e == nil || (e.Code != ProtocolViolation && !strings.Contains(e.Message, "protocol_violation")) {
				t.Fatalf("the flooding peer's connection ended with %v after %v, want protocol_violation", e, d)
			}
			select {
			case err := <-goodErr:
				t.Fatal(err)
			default:
			}
			if good64.Load() == 0 {
				t.Fatal("the other client made no echo during the flood")
			}
			if n := max(sN, cN); n <= spuriousBurst {
				t.Fatalf("%d spurious wake-ups counted, want over %d", n, spuriousBurst)
			}
			echoes(t, good, 5, 64<<10)
		})
	}
}

// TestSpuriousWakesAreRare: under the load of the TestShmCalls* tests (1
// and 16 callers, 0 B to 1 MiB, copying and in-place servers) the
// wake-ups that find nothing changed stay far under the bound
// (spuriousBurst, then spuriousRate a second): it ends no honest connection.
func TestSpuriousWakesAreRare(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		s := NewServer(ServerOptions{ShmInPlace: inPlace})
		s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
			return append(dst, req...), nil
		})
		s.HandleRaw("nap", func(ctx context.Context, req, dst []byte) ([]byte, error) {
			time.Sleep(50 * time.Microsecond)
			return append(dst, req...), nil
		})
		addr := startServer(t, s)
		c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, ShmConns: 1, ShmCalls: true})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		var wg sync.WaitGroup
		for _, callers := range []int{1, 16} {
			for g := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 30 / callers * 4 {
						method := "echo"
						if i%3 == 0 {
							method = "nap"
						}
						n := []int{0, 64, 64 << 10, 1 << 20}[i%4]
						if _, err := c.CallRaw(ctx, method, pattern(n, g+i), nil); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		cancel()
		d := time.Since(t0)
		sv, cl := s.ShmStats(), c.ShmStats()
		t.Logf("in place %v: %d slot calls in %v: spurious wake-ups: server %d, client %d", inPlace, cl.SlotCalls, d.Round(time.Millisecond), sv.SpuriousWakes, cl.SpuriousWakes)
		if cl.SlotCalls == 0 {
			t.Fatal("no call through call slots")
		}
		for side, n := range map[string]uint64{"server": sv.SpuriousWakes, "client": cl.SpuriousWakes} {
			if n > spuriousBurst/10 {
				t.Fatalf("in place %v: %s: %d spurious wake-ups in %v of honest calls, too close to the bound (%d, then %d a second)", inPlace, side, n, d, spuriousBurst, spuriousRate)
			}
		}
		c.Close()
	}
}

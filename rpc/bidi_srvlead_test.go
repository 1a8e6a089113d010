package rpc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

// The server's bidi read role (bidi_lead.go): a handler parked in recv reads
// its next item itself.

// srvLeading reports whether a handler's recv on one of s's connections
// reads the socket as the holder of the read role.
func srvLeading(s *Server) bool {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for c := range s.watchConns {
		c.mu.Lock()
		l := c.leadIn != nil
		c.mu.Unlock()
		if l {
			return true
		}
	}
	return false
}

// waitSrvLeading waits up to d for srvLeading.
func waitSrvLeading(s *Server, d time.Duration) bool {
	for end := time.Now().Add(d); !srvLeading(s); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestBidiServerRecvReadsItself: in a ping-pong the handler's recv reads
// its items itself instead of being handed each by the connection's
// reader; the sums stay right. With the role kept by the reader
// (noBidiLead) no item is read by a handler, so the count is the change's.
func TestBidiServerRecvReadsItself(t *testing.T) {
	for _, lead := range []bool{true, false} {
		t.Run(fmt.Sprintf("lead=%v", lead), func(t *testing.T) {
			s := sumServer()
			s.noBidiLead = !lead
			c := dial(t, startServer(t, s))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, err := OpenJSONBidi[int, int](ctx, c, "sum")
			if err != nil {
				t.Fatal(err)
			}
			const rounds = 300
			sumRounds(t, st, rounds)
			led, passes := s.bidiLedItems.Load(), s.bidiPasses.Load()
			t.Logf("%d rounds: the handler read %d items itself; the reader passed it the role %d times", rounds, led, passes)
			if !lead {
				if led != 0 || passes != 0 {
					t.Fatalf("noBidiLead: %d items led, %d passes", led, passes)
				}
				return
			}
			// Every item but the first could be read by the handler; the
			// watchdog takes the role from a handler that the machine
			// stalls for a tick between recvs, and the reader passes it
			// back with the next item.
			if led < rounds/2 {
				t.Fatalf("the handler read %d of %d items itself", led, rounds)
			}
		})
	}
}

// holdBidiServer is sumServer plus "hold" (blockingBidi: answers the first
// item, then waits in recv) whose recv results go to ended.
func holdBidiServer(ended chan error) *Server {
	s := sumServer()
	blockingBidi(s, ended)
	return s
}

// TestBidiServerLeaderCanceled: a handler whose recv reads the socket (it
// holds the read role) waiting for an item that does not come returns when
// the client cancels the call (a cancel frame it reads itself), and the
// connection is read on: unary and bidi calls on it complete.
func TestBidiServerLeaderCanceled(t *testing.T) {
	ended := make(chan error, 100)
	s := holdBidiServer(ended)
	s.noWatchLead = true
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	led := false
	for try := 0; try < 20 && !led; try++ {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := c.Bidi(ctx, "hold")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // so that recv is parked when the item comes (else: tried again)
		st.SendRaw([]byte("x"))
		if _, err := st.RecvRaw(); err != nil {
			t.Fatal(err)
		}
		led = waitSrvLeading(s, 500*time.Millisecond)
		cancel()
		select {
		case err := <-ended:
			if CodeOf(err) != Canceled {
				t.Fatalf("recv: %v, want Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler's recv (leading: %v) did not end when the client canceled", led)
		}
		checkConnServes(t, c)
	}
	if !led {
		t.Fatal("in 20 tries the handler's recv never read the socket itself")
	}
}

// checkConnServes makes a unary call and a bidi round trip on c.
func checkConnServes(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := c.CallRaw(ctx, "echo", []byte("after"), nil); err != nil || string(out) != "after" {
		t.Fatalf("unary call after: %q %v", out, err)
	}
	st, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Send(5)
	if n, err := st.Recv(); err != nil || n != 5 {
		t.Fatalf("bidi after: %d %v", n, err)
	}
}

// openRawHold opens "hold" as call id on a raw connection with the given
// deadline (0: none), sends one item and reads the answer.
func openRawHold(t *testing.T, conn net.Conn, r *frame.Reader, id uint32, deadline time.Duration) {
	t.Helper()
	h := frame.Header{Type: frame.TypeRequest, Flags: frame.FlagStream | frame.FlagClientStream, ID: id, Aux: uint32(deadline / time.Microsecond)}
	head := frame.AppendRequestHead(nil, "hold")
	h.HeadLen = uint16(len(head))
	out := append(h.Append(nil), head...)
	conn.Write(out)
	time.Sleep(5 * time.Millisecond) // so that recv is parked when the item comes (else: tried again)
	d := frame.Header{Type: frame.TypeRequestData, ID: id, PayloadLen: 1}
	conn.Write(append(d.Append(nil), 'x'))
	for {
		f, err := r.ReadFrame(nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.ID == id && f.Type == frame.TypeStreamData {
			return
		}
	}
}

// TestBidiServerLeaderDeadline: the call's deadline passes while its
// handler's recv waits in the socket read as the role's holder, and the
// client sends nothing (no cancel frame): the read is interrupted, recv
// returns DeadlineExceeded, and the interrupt does not reach the reader
// that takes over (the next call on the connection is answered).
func TestBidiServerLeaderDeadline(t *testing.T) {
	ended := make(chan error, 100)
	s := holdBidiServer(ended)
	s.noWatchLead = true
	conn, r, _ := rawServerConn(t, startServer(t, s))
	leaderDeadline(t, s, conn, r, ended)
}

// TestBidiServerLeaderDeadlineTLS is TestBidiServerLeaderDeadline over
// tls: (the interrupting read deadline is set on the *tls.Conn, whose read
// must go on after it).
func TestBidiServerLeaderDeadlineTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	f := testpki.Write(dir, "server", ca.Issue(testpki.Leaf{CommonName: "db", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: tlsDBID}), ca.PEM)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := uds.Listen(context.Background(), "tls:127.0.0.1:0", uds.ListenOptions{TLS: src.ServerConfig()})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 100)
	s := holdBidiServer(ended)
	s.noWatchLead = true
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	cli := tlsClient(t, dir, ca, tlsWebID)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(l.UAddr().String(), "tls:"), cli.ClientConfig(tlsfiles.ClientOptions{ServerSPIFFEID: tlsDBID}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	var hb [frame.HelloSize]byte
	(&frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | frame.FeatureClientStream, MaxFrame: frame.DefaultMaxFrame}).Put(hb[:])
	if _, err := conn.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	r := frame.NewReader(conn, 0)
	if _, err := r.ReadHello(); err != nil {
		t.Fatal(err)
	}
	leaderDeadline(t, s, conn, r, ended)
}

// leaderDeadline is the body of the TestBidiServerLeaderDeadline tests, on
// a connection whose hello is exchanged.
func leaderDeadline(t *testing.T, s *Server, conn net.Conn, r *frame.Reader, ended chan error) {
	led := false
	for id := uint32(1); id <= 20 && !led; id += 2 {
		openRawHold(t, conn, r, id, 300*time.Millisecond)
		led = waitSrvLeading(s, 250*time.Millisecond)
		select {
		case err := <-ended:
			if CodeOf(err) != DeadlineExceeded {
				t.Fatalf("recv: %v, want DeadlineExceeded", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler's recv (leading: %v) did not end at its deadline", led)
		}
		// The connection is read on: a unary echo.
		h := frame.Header{Type: frame.TypeRequest, ID: id + 1, PayloadLen: 2}
		head := frame.AppendRequestHead(nil, "echo")
		h.HeadLen = uint16(len(head))
		conn.Write(append(append(h.Append(nil), head...), "ok"...))
		for {
			f, err := r.ReadFrame(nil)
			if err != nil {
				t.Fatalf("after the deadline: %v", err)
			}
			if f.ID == id+1 {
				if f.Type != frame.TypeResponse || string(f.Payload) != "ok" {
					t.Fatalf("echo after the deadline: %s %q", f.Type, f.Payload)
				}
				break
			}
		}
	}
	if !led {
		t.Fatal("in 10 tries the handler's recv never read the socket itself")
	}
}

// TestBidiServerLeaderConnClosed: the client closes the connection while
// the handler's recv reads it as the role's holder: recv returns (the
// reader that takes over sees the end), and Shutdown finds nothing left.
func TestBidiServerLeaderConnClosed(t *testing.T) {
	ended := make(chan error, 100)
	s := holdBidiServer(ended)
	s.noWatchLead = true
	addr := startServer(t, s)
	led := false
	for try := 0; try < 10 && !led; try++ {
		conn, r, _ := rawServerConn(t, addr)
		openRawHold(t, conn, r, 1, 0)
		led = waitSrvLeading(s, 250*time.Millisecond)
		conn.Close()
		select {
		case err := <-ended:
			if err != io.EOF && CodeOf(err) != Canceled {
				t.Fatalf("recv: %v, want io.EOF or Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler's recv (leading: %v) did not end when the client closed", led)
		}
	}
	if !led {
		t.Fatal("in 10 tries the handler's recv never read the socket itself")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestBidiServerLeaderDrain: the server drains while a handler's recv reads
// the socket as the role's holder: the call goes on to its end, a unary call
// on the same connection is still answered or refused (not left hanging),
// and Shutdown returns once the call has ended.
func TestBidiServerLeaderDrain(t *testing.T) {
	s := sumServer()
	s.noWatchLead = true
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, NoReconnect: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var st *TypedBidi[int, int]
	total := 0
	for try := 0; try < 20; try++ {
		var err error
		if st, err = OpenJSONBidi[int, int](ctx, c, "sum"); err != nil {
			t.Fatal(err)
		}
		// So that recv is parked when the item comes (else: tried again;
		// with one P the reader always read the item before the handler
		// ran, and the 20 tries all failed).
		time.Sleep(5 * time.Millisecond)
		st.Send(1)
		if got, err := st.Recv(); err != nil || got != 1 {
			t.Fatalf("%d %v", got, err)
		}
		if waitSrvLeading(s, 250*time.Millisecond) {
			total = 1
			break
		}
		st.Close()
		st = nil
	}
	if st == nil {
		t.Fatal("in 20 tries the handler's recv never read the socket itself")
	}
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond) // the goaway is out
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a bidi call in flight: %v", err)
	default:
	}
	uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
	if out, err := c.CallRaw(uctx, "echo", []byte("u"), nil); err == nil && string(out) != "u" || err != nil && CodeOf(err) != Unavailable {
		t.Fatalf("unary call in the drain: %q %v", out, err)
	}
	ucancel()
	for i := 2; i <= 10; i++ {
		st.Send(i)
		total += i
		if got, err := st.Recv(); err != nil || got != total {
			t.Fatalf("after the goaway: %d %v, want %d", got, err, total)
		}
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestBidiServerLeaderMixed: bidi ping-pongs, unary calls and a server
// stream share one connection; handlers read their own items while the
// other frames still reach their calls (a leader steps aside for a request
// and delivers other calls' items).
func TestBidiServerLeaderMixed(t *testing.T) {
	s := sumServer()
	s.HandleRawStream("count", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := range 200 {
			if err := send([]byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const rounds = 200
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for b := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := OpenJSONBidi[int, int](ctx, c, "sum")
			if err != nil {
				errs <- err
				return
			}
			want := 0
			for i := 1; i <= rounds; i++ {
				st.Send(i + b)
				want += i + b
				if got, err := st.Recv(); err != nil || got != want {
					errs <- fmt.Errorf("bidi %d round %d: %d %v, want %d", b, i, got, err, want)
					return
				}
			}
			st.CloseSend()
			if _, err := st.Recv(); err != io.EOF {
				errs <- fmt.Errorf("bidi %d end: %v", b, err)
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range rounds {
			msg := []byte(fmt.Sprint(i))
			if out, err := c.CallRaw(ctx, "echo", msg, nil); err != nil || !bytes.Equal(out, msg) {
				errs <- fmt.Errorf("unary %d: %q %v", i, out, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 5 {
			st, err := c.Stream(ctx, "count", []byte(nil))
			if err != nil {
				errs <- err
				return
			}
			for i := range 200 {
				if it, err := st.RecvRaw(); err != nil || len(it) != 1 || it[0] != byte(i) {
					errs <- fmt.Errorf("stream item %d: %v %v", i, it, err)
					return
				}
			}
			if _, err := st.RecvRaw(); err != io.EOF {
				errs <- fmt.Errorf("stream end: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("handlers read %d items themselves; %d passes", s.bidiLedItems.Load(), s.bidiPasses.Load())
	// The mix above must be right whoever reads; that a handler reads at all
	// depends on it coming back to recv within a tick, which a loaded machine
	// (CI, -race) may deny for 200 rounds (about 1 run in 10 there). So, if none
	// did, go on with one ping-pong alone, bounded, until one does.
	if s.bidiLedItems.Load() == 0 {
		st, err := OpenJSONBidi[int, int](ctx, c, "sum")
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		want, i := 0, 0
		for end := time.Now().Add(10 * time.Second); s.bidiLedItems.Load() == 0 && i < 20000 && time.Now().Before(end); {
			i++
			st.Send(i)
			want += i
			if got, err := st.Recv(); err != nil || got != want {
				t.Fatalf("alone, round %d: %d %v, want %d", i, got, err, want)
			}
		}
		t.Logf("alone: %d rounds until a handler read an item itself", i)
	}
	if s.bidiLedItems.Load() == 0 {
		t.Fatal("no handler read an item itself, not even alone")
	}
}

// TestBidiServerLeaderCreditWait: a handler that holds the read role (it
// took its item with it, or read it itself) and then waits for stream credit from a client
// that stops reading that call gives the role back: the other calls on the
// connection keep flowing. The watchdog, which would take the role from it
// after a tick or two, is kept out (noWatchLead), so without the hand-back
// nobody would read the connection.
func TestBidiServerLeaderCreditWait(t *testing.T) {
	s := sumServer()
	s.noWatchLead = true
	var sent atomic.Int64
	// spew echoes items until "go", then sends 40 items of 64 KiB: the
	// echoes first make its handler known quick (handler.leadable), so that
	// it takes "go" with the read role.
	s.HandleRawBidi("spew", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err != nil {
				return err
			}
			if string(it) == "go" {
				break
			}
			if err := send(it); err != nil {
				return err
			}
		}
		for range 40 {
			if err := send(make([]byte, 64<<10)); err != nil {
				return err
			}
			sent.Add(1)
		}
		_, err := recv()
		if err == io.EOF {
			return nil
		}
		return err
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st *BidiStream
	for try := 0; try < 20 && st == nil; try++ {
		sent.Store(0)
		var err error
		if st, err = c.Bidi(ctx, "spew"); err != nil {
			t.Fatal(err)
		}
		for range 50 {
			st.SendRaw([]byte("ping"))
			if _, err := st.RecvRaw(); err != nil {
				t.Fatal(err)
			}
		}
		// The handler's recv holds the role (it leads) or is handed it
		// with "go" by the reader: either counts.
		took := s.bidiPasses.Load() + s.bidiLedItems.Load()
		st.SendRaw([]byte("go"))
		settled(&sent)
		if s.bidiPasses.Load()+s.bidiLedItems.Load() == took { // the handler did not get the role: again
			st.Close()
			st = nil
		}
	}
	if st == nil {
		t.Fatal("in 20 tries the reader never passed the role to the handler")
	}
	defer st.Close()
	n := sent.Load()
	if window := int64(frame.InitialStreamCredit/(64<<10)) + 1; n > window || n == 40 {
		t.Fatalf("server sent %d of 40 items to a client that reads none; credit allows %d", n, window)
	}
	for i := range 10 {
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		if out, err := c.CallRaw(octx, "echo", []byte{byte(i)}, nil); err != nil || len(out) != 1 {
			t.Fatalf("echo beside a credit-starved bidi call: %q %v", out, err)
		}
		other, err := OpenJSONBidi[int, int](octx, c, "sum")
		if err != nil {
			t.Fatal(err)
		}
		for j := 1; j <= 3; j++ {
			other.Send(j)
			got, err := other.Recv()
			if err != nil || got != j*(j+1)/2 {
				t.Fatalf("sum beside a credit-starved bidi call %d round %d: %d %v", i, j, got, err)
			}
		}
		other.CloseSend()
		ocancel()
	}
	for i := range 40 {
		if _, err := st.RecvRaw(); err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// TestBidiServerLeaderBusyHandler: a handler that took its item with the
// read role and then blocks on something else (not recv, not send) has the
// role taken from it by the watchdog, as a slow inline handler does: the
// other calls on the connection keep flowing.
func TestBidiServerLeaderBusyHandler(t *testing.T) {
	s := sumServer()
	release := make(chan struct{})
	s.HandleRawBidi("block", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			if _, err := recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			<-release
		}
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.Bidi(ctx, "block")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	st.SendRaw([]byte("x"))
	for i := range 20 {
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		if out, err := c.CallRaw(octx, "echo", []byte{byte(i)}, nil); err != nil || len(out) != 1 {
			t.Fatalf("echo beside a blocked bidi handler: %q %v", out, err)
		}
		ocancel()
	}
	close(release)
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// TestBidiServerLeaderCreditOverrun: while a handler's recv reads the socket
// as the role's holder, the client overruns another call's request credit:
// the leader reports the violation (the connection closes with
// ProtocolViolation) and its own recv ends.
func TestBidiServerLeaderCreditOverrun(t *testing.T) {
	ended := make(chan error, 100)
	s := holdBidiServer(ended)
	s.noWatchLead = true
	s.HandleRawBidi("stuck", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	addr := startServer(t, s)
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("in 10 tries the handler's recv never read the socket itself")
		}
		conn, r, _ := rawServerConn(t, addr)
		openRawHold(t, conn, r, 1, 0)
		if !waitSrvLeading(s, 250*time.Millisecond) {
			conn.Close()
			<-ended
			continue
		}
		overrunCredit(t, conn, r, 3)
		select {
		case err := <-ended:
			if CodeOf(err) != Canceled {
				t.Fatalf("recv: %v, want Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the leading handler's recv did not end when the connection failed")
		}
		return
	}
}

// TestBidiServerSlowHandlerNotGivenRole: a handler that works longer than
// a tick between recvs is never given the read role (handler.leadable): it
// would hold the other calls of its connection up on every item until the
// watchdog took the role. A quick one is (TestBidiServerRecvReadsItself).
func TestBidiServerSlowHandlerNotGivenRole(t *testing.T) {
	s := sumServer()
	s.HandleRawBidi("slow", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			time.Sleep(3 * time.Millisecond)
			if err := send(it); err != nil {
				return err
			}
		}
	})
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Bidi(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		time.Sleep(time.Millisecond) // recv is parked when the item comes
		if err := st.SendRaw([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if it, err := st.RecvRaw(); err != nil || len(it) != 1 || it[0] != byte(i) {
			t.Fatalf("round %d: %v %v", i, it, err)
		}
	}
	st.CloseSend()
	if _, err := st.RecvRaw(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if p, l := s.bidiPasses.Load(), s.bidiLedItems.Load(); p != 0 || l != 0 {
		t.Fatalf("a handler busy 3 ms per item was given the role %d times and read %d items itself", p, l)
	}
}

// noDeadlineConn is a connection that refuses deadlines, as a net.Conn a
// program passes to ServeConn may.
type noDeadlineConn struct{ net.Conn }

func (noDeadlineConn) SetDeadline(time.Time) error     { return errors.ErrUnsupported }
func (noDeadlineConn) SetReadDeadline(time.Time) error { return errors.ErrUnsupported }

// TestBidiServerNoLeadWithoutDeadlines: on a connection without read
// deadlines a bidi handler never gets the read role (nothing could
// interrupt its read when its ctx ends); its ping-pong still works, and a
// call canceled while its handler waits in recv ends.
func TestBidiServerNoLeadWithoutDeadlines(t *testing.T) {
	ended := make(chan error, 10)
	s := holdBidiServer(ended)
	s.opts.WrapConn = func(c net.Conn) net.Conn { return noDeadlineConn{c} }
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := OpenJSONBidi[int, int](ctx, c, "sum")
	if err != nil {
		t.Fatal(err)
	}
	sumRounds(t, st, 200)
	if led, passes := s.bidiLedItems.Load(), s.bidiPasses.Load(); led != 0 || passes != 0 {
		t.Fatalf("without deadlines: %d items led, %d role passes, want none", led, passes)
	}
	hctx, hcancel := context.WithCancel(ctx)
	hold, err := c.Bidi(hctx, "hold")
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.SendRaw([]byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := hold.RecvRaw(); err != nil {
		t.Fatal(err)
	}
	hcancel()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled handler waiting in recv did not end")
	}
}

// sumRounds sends 1..rounds on a "sum" call, checking each running sum it
// answers, then half-closes and expects the call's end.
func sumRounds(t *testing.T, st *TypedBidi[int, int], rounds int) {
	t.Helper()
	want := 0
	for i := 1; i <= rounds; i++ {
		if err := st.Send(i); err != nil {
			t.Fatal(err)
		}
		want += i
		if got, err := st.Recv(); err != nil || got != want {
			t.Fatalf("round %d: %d %v, want %d", i, got, err, want)
		}
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want io.EOF", err)
	}
}

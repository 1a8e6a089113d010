package rpcprom_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcprom"
	"github.com/udskit/udskit/uds"
)

// rawConn is a framed udskit connection written by hand, to send what a
// well-behaved client never does (too many calls, calls after goaway).
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var b [frame.HelloSize]byte
	(&frame.Hello{Version: frame.Version, MaxFrame: frame.DefaultMaxFrame}).Put(b[:])
	if _, err := c.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if _, err := io.ReadFull(r, b[:]); err != nil {
		t.Fatal(err)
	}
	return &rawConn{t: t, c: c, r: r}
}

// requests sends a request for each id, method pair, in one write.
func (rc *rawConn) requests(idMethod ...any) {
	rc.t.Helper()
	var b []byte
	for i := 0; i < len(idMethod); i += 2 {
		head := frame.AppendRequestHead(nil, idMethod[i+1].(string))
		h := frame.Header{Type: frame.TypeRequest, HeadLen: uint16(len(head)), ID: uint32(idMethod[i].(int))}
		b = append(h.Append(b), head...)
	}
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

// next reads frames until one of type typ for id (id 0: a connection error).
func (rc *rawConn) next(typ frame.Type, id uint32) frame.Header {
	rc.t.Helper()
	for {
		var b [frame.HeaderSize]byte
		if _, err := io.ReadFull(rc.r, b[:]); err != nil {
			rc.t.Fatalf("waiting for %s on id %d: %v", typ, id, err)
		}
		h := frame.ParseHeader(b[:])
		if _, err := rc.r.Discard(int(h.HeadLen) + int(h.PayloadLen)); err != nil {
			rc.t.Fatal(err)
		}
		if h.Type == typ && h.ID == id {
			return h
		}
	}
}

// Calls refused before any handler (unknown method, wrong kind, over the
// in-flight limit, during a drain; framed and NDJSON) reach OnRefused and
// rpcprom's udskit_rpc_server_refused_calls_total{reason,code}, scraped by
// curl, and stay out of the per-method call counts; a connection refused by
// the listener's policy is counted too.
func TestRefusedCallsScraped(t *testing.T) {
	m := rpcprom.New(rpcprom.Options{})
	dir := t.TempDir()
	l, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "app.sock"), uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	locked, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "locked.sock"), uds.ListenOptions{
		Policy: func(uds.Cred) error { return fmt.Errorf("%w: nobody today", uds.ErrPeerRefused) },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []rpc.RefusedCall
	opts := m.ServerOptions(rpc.ServerOptions{MaxInFlight: 2, OnRefused: func(rc rpc.RefusedCall) {
		mu.Lock()
		seen = append(seen, rc)
		mu.Unlock()
	}})
	s := rpc.NewServer(opts)
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	release := make(chan struct{})
	var started atomic.Int32
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return dst, nil
	})
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error { return send([]byte("x")) })
	m.WatchServer(s)
	m.WatchListener(locked)
	go s.Serve(l)
	go s.Serve(locked)
	defer s.Close()

	url := serveMetrics(t, m)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, l.Addr().String(), rpc.ClientOptions{Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CallRaw(ctx, "nosuch", nil, nil); rpc.CodeOf(err) != rpc.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := c.CallRaw(ctx, "items", nil, nil); rpc.CodeOf(err) != rpc.Unimplemented {
		t.Fatalf("a stream called as unary: %v", err)
	}
	if st, err := c.Stream(ctx, "echo", nil); err == nil {
		if _, err = st.RecvRaw(); rpc.CodeOf(err) != rpc.Unimplemented {
			t.Fatalf("unary called as a stream: %v", err)
		}
	} else if rpc.CodeOf(err) != rpc.Unimplemented {
		t.Fatalf("unary called as a stream: %v", err)
	}
	// A unary method opened as a bidirectional stream (spec 4.3).
	if b, err := c.Bidi(ctx, "echo"); err == nil {
		if err = b.Recv(new(any)); rpc.CodeOf(err) != rpc.Unimplemented {
			t.Fatalf("unary opened as bidi: %v", err)
		}
	} else if rpc.CodeOf(err) != rpc.Unimplemented {
		t.Fatalf("unary opened as bidi: %v", err)
	}
	if _, err := c.CallRaw(ctx, "echo", []byte("ok"), nil); err != nil {
		t.Fatal(err)
	}
	// NDJSON: an unknown method.
	nd, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	fmt.Fprintf(nd, "{\"id\":1,\"func\":\"nope\",\"data\":{}}\n")
	if line, err := bufio.NewReader(nd).ReadString('\n'); err != nil || !containsAll(line, `"unimplemented"`) {
		t.Fatalf("NDJSON unknown method: %q %v", line, err)
	}
	// Over MaxInFlight on one connection: the server closes it.
	over := dialRaw(t, l.Addr().String())
	over.requests(1, "block", 3, "block", 5, "echo")
	if h := over.next(frame.TypeError, 0); rpc.Code(h.Aux) != rpc.ResourceExhausted {
		t.Fatalf("over the in-flight limit: code %d", h.Aux)
	}
	if _, err := rpc.Dial(ctx, locked.Addr().String(), rpc.ClientOptions{NoReconnect: true}); err == nil {
		t.Fatal("the locked listener let a client in")
	}
	waitFor(t, func() bool { return locked.Refused() == 1 })
	// A drain: a call sent after goaway is refused unprocessed.
	dr := dialRaw(t, l.Addr().String())
	n := started.Load()
	dr.requests(1, "block") // keeps the drain going
	waitFor(t, func() bool { return started.Load() > n })
	done := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		done <- s.Shutdown(sctx)
	}()
	dr.next(frame.TypeGoAway, 0)
	dr.requests(3, "echo")
	if h := dr.next(frame.TypeError, 3); rpc.Code(h.Aux) != rpc.Unavailable || h.Flags&frame.FlagRefused == 0 {
		t.Fatalf("a call during the drain: code %d flags %#x", h.Aux, h.Flags)
	}

	body := scrape(t, url)
	for series, want := range map[string]float64{
		`udskit_rpc_server_refused_calls_total{code="unimplemented",reason="unknown_method"}`: 2,
		`udskit_rpc_server_refused_calls_total{code="unimplemented",reason="wrong_kind"}`:     3,
		`udskit_rpc_server_refused_calls_total{code="resource_exhausted",reason="in_flight"}`: 1,
		`udskit_rpc_server_refused_calls_total{code="unavailable",reason="draining"}`:         1,
		`udskit_rpc_server_refused_connections_total{reason="policy"}`:                        1,
		`udskit_rpc_server_calls_total{code="ok",method="echo"}`:                              1,
		`udskit_rpc_server_draining`: 1,
	} {
		if got := value(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	for _, series := range []string{`method="nosuch"`, `method="nope"`} {
		if containsAll(body, series) {
			t.Errorf("the exposition has %s: an unknown method's name must not become a label", series)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	// OnRefused of the options given to ServerOptions still runs, with what a handler would see.
	mu.Lock()
	defer mu.Unlock()
	byReason := map[rpc.RefusalReason][]rpc.RefusedCall{}
	for _, rc := range seen {
		byReason[rc.Reason] = append(byReason[rc.Reason], rc)
	}
	if len(seen) != 7 || len(byReason[rpc.RefusedUnknownMethod]) != 2 || len(byReason[rpc.RefusedWrongKind]) != 3 {
		t.Fatalf("OnRefused saw %+v", seen)
	}
	if u := byReason[rpc.RefusedUnknownMethod]; u[0].Method != "nosuch" || u[0].NDJSON || u[1].Method != "nope" || !u[1].NDJSON {
		t.Fatalf("unknown methods: %+v", u)
	}
	if w := byReason[rpc.RefusedWrongKind]; w[0].Method != "items" || w[0].Stream || w[1].Method != "echo" || !w[1].Stream || w[1].ClientStream ||
		w[2].Method != "echo" || !w[2].Stream || !w[2].ClientStream {
		t.Fatalf("wrong kinds: %+v", w)
	}
	if d := byReason[rpc.RefusedDraining]; len(d) != 1 || d[0].Method != "echo" || !d[0].HasCred || d[0].Cred.PID == 0 {
		t.Fatalf("draining: %+v", d)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package rpc

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
)

// Every server answers udskit.health without registering it, per service,
// and the method is not among the listed ones.
func TestHealthServingAndServices(t *testing.T) {
	s := echoServer()
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if st, err := CheckHealth(ctx, c, ""); err != nil || st != HealthServing {
		t.Fatalf("health of a fresh server: %q, %v; want serving", st, err)
	}
	// An empty payload and {} mean the same.
	out, err := c.CallRaw(ctx, HealthMethod, nil, nil)
	if err != nil || string(out) != `{"status":"serving"}` {
		t.Fatalf("health with an empty request: %s, %v", out, err)
	}
	if _, err := CheckHealth(ctx, c, "db"); CodeOf(err) != NotFound || !strings.Contains(err.Error(), `"db"`) {
		t.Fatalf("health of an unknown service: %v; want not_found naming it", err)
	}
	s.SetHealth("db", HealthNotServing)
	s.SetHealth("cache", HealthServing)
	if st, _ := CheckHealth(ctx, c, "db"); st != HealthNotServing {
		t.Fatalf("db: %q, want not_serving", st)
	}
	if st, _ := CheckHealth(ctx, c, "cache"); st != HealthServing {
		t.Fatalf("cache: %q, want serving", st)
	}
	if st, _ := CheckHealth(ctx, c, ""); st != HealthServing {
		t.Fatalf("server: %q, want serving (a service's status is its own)", st)
	}
	// The whole server not serving: so is every service.
	s.SetHealth("", HealthNotServing)
	if st, _ := CheckHealth(ctx, c, "cache"); st != HealthNotServing {
		t.Fatalf("cache with the server not serving: %q", st)
	}
	s.SetHealth("", HealthServing)
	s.RemoveHealth("db")
	if _, err := CheckHealth(ctx, c, "db"); CodeOf(err) != NotFound {
		t.Fatalf("health of a removed service: %v", err)
	}
	// A bad request is invalid_argument, not a crash or a serving answer.
	if _, err := c.CallRaw(ctx, HealthMethod, []byte(`{"service":`), nil); CodeOf(err) != InvalidArgument {
		t.Fatalf("health with bad JSON: %v", err)
	}
	if _, err := c.CallRaw(ctx, HealthMethod, []byte(`{"service":"`+strings.Repeat("x", maxHealthRequest)+`"}`), nil); CodeOf(err) != InvalidArgument {
		t.Fatalf("health with an oversized request: %v", err)
	}
	if m := s.Methods(); !slices.Equal(m, []string{"echo"}) {
		t.Fatalf("Methods() = %v; want only the registered echo", m)
	}
}

// A linger-style drain: the whole server set draining keeps serving calls
// and reports draining for the server and every service.
func TestHealthSetDraining(t *testing.T) {
	s := echoServer()
	s.SetHealth("db", HealthServing)
	c := dial(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.SetHealth("", HealthDraining)
	for _, svc := range []string{"", "db"} {
		if st, err := CheckHealth(ctx, c, svc); err != nil || st != HealthDraining {
			t.Fatalf("health(%q) while set draining: %q, %v", svc, st, err)
		}
	}
	if out, err := c.CallRaw(ctx, "echo", []byte("x"), nil); err != nil || string(out) != "x" {
		t.Fatalf("echo while set draining: %q, %v (a linger drain keeps serving)", out, err)
	}
}

// From the first moment of Shutdown, the server reports draining: on a
// connection it still serves (one accepted just before the drain) the
// health method is answered, with "draining", while other calls are
// refused unprocessed as before.
func TestHealthDuringShutdown(t *testing.T) {
	s := NewServer(ServerOptions{})
	release := make(chan struct{})
	started := make(chan struct{})
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		close(started)
		<-release
		return dst, nil
	})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	addr := startServer(t, s)
	c := dial(t, addr)
	held := make(chan error, 1)
	go func() {
		_, err := c.CallRaw(context.Background(), "hold", nil, nil)
		held <- err
	}()
	<-started
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if st, _ := s.Health(""); st == HealthDraining {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Health() did not turn draining after Shutdown started")
		}
		time.Sleep(time.Millisecond)
	}

	// A connection accepted just before the drain, served through it: a
	// framed peer gets hello and goaway, then its calls are answered.
	path := filepath.Join(t.TempDir(), "late.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeConn(sc)
	cc.SetDeadline(time.Now().Add(10 * time.Second))
	b := append([]byte(nil), clientHello(frame.FeatureStreamCredit)...)
	b = appendRequest(b, 1, HealthMethod, 2)
	b = append(b, "{}"...)
	b = appendRequest(b, 2, "echo", 1)
	b = append(b, "x"...)
	if _, err := cc.Write(b); err != nil {
		t.Fatal(err)
	}
	r := frame.NewReader(cc, 0)
	if _, err := r.ReadHello(); err != nil {
		t.Fatal(err)
	}
	got := map[uint32]frame.Frame{}
	for len(got) < 2 {
		f, err := r.ReadFrame(nil)
		if err != nil {
			t.Fatalf("read the answers: %v (got %v)", err, got)
		}
		if f.Type != frame.TypeGoAway {
			f.Payload, f.Head = append([]byte(nil), f.Payload...), append([]byte(nil), f.Head...)
			got[f.ID] = f
		}
	}
	if f := got[1]; f.Type != frame.TypeResponse || string(f.Payload) != `{"status":"draining"}` {
		t.Fatalf("health during Shutdown: %s %q %q; want a response with status draining", f.Type, f.Head, f.Payload)
	}
	if f := got[2]; f.Type != frame.TypeError || Code(f.Aux) != Unavailable || f.Flags&frame.FlagRefused == 0 {
		t.Fatalf("echo during Shutdown: %s code %d; want refused unavailable", f.Type, f.Aux)
	}

	unblock()
	if err := <-held; err != nil {
		t.Fatalf("the held call: %v", err)
	}
	cc.Close()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if st, _ := s.Health(""); st != HealthDraining {
		t.Fatalf("after Shutdown: %q", st)
	}
	if !errors.Is(s.Serve(l), ErrServerClosed) {
		t.Fatal("Serve after Shutdown did not say closed")
	}
}

// FuzzHealthRequest: any request bytes get an answer or an invalid_argument
// error, never a panic, and a known status when they parse.
func FuzzHealthRequest(f *testing.F) {
	for _, s := range []string{"", "{}", "null", `{"service":"db"}`, `{"service":`, `[]`, `{"service":1}`, `{"service":"` + strings.Repeat("x", 5000) + `"}`} {
		f.Add([]byte(s))
	}
	s := NewServer(ServerOptions{})
	s.SetHealth("db", HealthNotServing)
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := s.healthHandler(context.Background(), in, nil)
		if err != nil {
			if c := CodeOf(err); c != InvalidArgument && c != NotFound {
				t.Fatalf("%q: %v", in, err)
			}
			return
		}
		switch string(out) {
		case `{"status":"serving"}`, `{"status":"not_serving"}`:
		default:
			t.Fatalf("%q: answered %s", in, out)
		}
	})
}

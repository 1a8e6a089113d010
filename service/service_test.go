package service

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/internal/testutil"
)

// fakeService serves until Shutdown; Shutdown waits for busy to close or ctx.
type fakeService struct {
	stop      chan struct{}
	busy      chan struct{}
	once      sync.Once
	serveErr  error
	shutdowns int
}

func newFake() *fakeService {
	return &fakeService{stop: make(chan struct{}), busy: make(chan struct{})}
}

func (f *fakeService) Serve() error {
	<-f.stop
	return f.serveErr
}

func (f *fakeService) Shutdown(ctx context.Context) error {
	f.shutdowns++
	defer f.once.Do(func() { close(f.stop) })
	select {
	case <-f.busy:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runO is Run returning only the Outcome, as the tests compare it.
func runO(ctx context.Context, opts Options, start func(context.Context, []*handoff.Listener) (Service, error)) (Outcome, error) {
	r, err := Run(ctx, opts, start)
	return r.Outcome, err
}

func run(t *testing.T, opts Options, svc *fakeService) (chan Outcome, chan error, *testutil.Buffer) {
	t.Helper()
	lb := &testutil.Buffer{}
	opts.Logger = slog.New(slog.NewTextHandler(lb, nil))
	oc, ec := make(chan Outcome, 1), make(chan error, 1)
	go func() {
		o, err := runO(context.Background(), opts, func(context.Context, []*handoff.Listener) (Service, error) { return svc, nil })
		oc <- o
		ec <- err
	}()
	return oc, ec, lb
}

func wait(t *testing.T, oc chan Outcome, ec chan error, d time.Duration) (Outcome, error) {
	t.Helper()
	select {
	case o := <-oc:
		return o, <-ec
	case <-time.After(d):
		t.Fatalf("Run still running after %v", d)
	}
	return 0, nil
}

func TestDrainCleanAfterWorkEnds(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	svc := newFake()
	oc, ec, lb := run(t, Options{Name: "proxy", DrainTimeout: 10 * time.Second, signals: sigs,
		Status: func() []any { return []any{"active", 1} }}, svc)
	sigs <- syscall.SIGTERM
	select {
	case <-oc:
		t.Fatal("Run returned while work was still open")
	case <-time.After(100 * time.Millisecond):
	}
	close(svc.busy)
	o, err := wait(t, oc, ec, 5*time.Second)
	if o != Drained || err != nil {
		t.Fatalf("got %v, %v; want drained, nil", o, err)
	}
	log := lb.String()
	for _, want := range []string{"proxy draining", "signal=terminated", "drain_timeout=10s", "active=1", "proxy drained; stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestDrainTimeoutClosesTheRest(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	svc := newFake()
	oc, ec, lb := run(t, Options{DrainTimeout: 200 * time.Millisecond, signals: sigs}, svc)
	start := time.Now()
	sigs <- os.Interrupt
	o, err := wait(t, oc, ec, 5*time.Second)
	if o != TimedOut || err != nil {
		t.Fatalf("got %v, %v; want timed out, nil", o, err)
	}
	if el := time.Since(start); el < 180*time.Millisecond {
		t.Errorf("returned after %v, before the 200ms drain timeout", el)
	}
	if !strings.Contains(lb.String(), "drain timeout: closed the remaining connections") {
		t.Errorf("log lacks the timeout line:\n%s", lb)
	}
}

// Any second signal, not only a second Ctrl-C, ends the drain at once.
func TestSecondSignalCutsShort(t *testing.T) {
	for _, pair := range [][2]os.Signal{{os.Interrupt, os.Interrupt}, {syscall.SIGTERM, os.Interrupt}, {os.Interrupt, syscall.SIGTERM}, {syscall.SIGHUP, syscall.SIGPIPE}} {
		sigs := make(chan os.Signal, 2)
		svc := newFake()
		// outputBroken: this SIGPIPE is one from a closed stdout pipe.
		oc, ec, lb := run(t, Options{DrainTimeout: time.Minute, signals: sigs, outputBroken: func() bool { return true }}, svc)
		sigs <- pair[0]
		for !strings.Contains(lb.String(), "draining") {
			time.Sleep(5 * time.Millisecond)
		}
		start := time.Now()
		sigs <- pair[1]
		o, err := wait(t, oc, ec, 5*time.Second)
		if o != CutShort || err != nil {
			t.Fatalf("%v then %v: got %v, %v; want cut short", pair[0], pair[1], o, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("second signal took %v", el)
		}
		if !strings.Contains(lb.String(), "second signal") {
			t.Errorf("log lacks the second-signal line:\n%s", lb)
		}
	}
}

func TestServeErrorWithoutSignal(t *testing.T) {
	svc := newFake()
	svc.serveErr = errors.New("accept: boom")
	oc, ec, _ := run(t, Options{signals: make(chan os.Signal)}, svc)
	close(svc.stop)
	o, err := wait(t, oc, ec, 5*time.Second)
	if o != Stopped || err == nil || err.Error() != "accept: boom" {
		t.Fatalf("got %v, %v; want stopped with Serve's error", o, err)
	}
	if svc.shutdowns != 0 {
		t.Errorf("Shutdown called %d times for a service that stopped on its own", svc.shutdowns)
	}
}

func TestStartErrorAndSignalDuringStart(t *testing.T) {
	want := errors.New("listen: address in use")
	o, err := runO(context.Background(), Options{signals: make(chan os.Signal)},
		func(context.Context, []*handoff.Listener) (Service, error) { return nil, want })
	if o != Stopped || !errors.Is(err, want) {
		t.Fatalf("got %v, %v; want start's error", o, err)
	}
	// A signal while start is still waiting ends start's context.
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	o, err = runO(context.Background(), Options{signals: sigs}, func(ctx context.Context, _ []*handoff.Listener) (Service, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
			return nil, errors.New("start's context did not end at the signal")
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, %v; want start aborted by the signal", o, err)
	}
}

// The real signal path: SIGTERM sent to this process is caught (the test
// process survives it) and drains; the default timeout applies at zero.
func TestRealSIGTERM(t *testing.T) {
	svc := newFake()
	close(svc.busy)
	lb := &testutil.Buffer{}
	o, err := runO(context.Background(), Options{Logger: slog.New(slog.NewTextHandler(lb, nil))},
		func(context.Context, []*handoff.Listener) (Service, error) {
			if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
				return nil, err
			}
			return svc, nil
		})
	if o != Drained || err != nil {
		t.Fatalf("got %v, %v", o, err)
	}
	if !strings.Contains(lb.String(), "drain_timeout=5s") {
		t.Errorf("default drain timeout not 5s:\n%s", lb)
	}
}

func TestContextCancelDrains(t *testing.T) {
	svc := newFake()
	close(svc.busy)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o, err := runO(ctx, Options{signals: make(chan os.Signal)}, func(context.Context, []*handoff.Listener) (Service, error) { return svc, nil })
	if o != Drained || err != nil {
		t.Fatalf("got %v, %v", o, err)
	}
}

// TestStopAndReadyHooks: Ready runs once serving; closing Stop drains like
// a signal and names its reason; a failing Ready stops the service and is
// returned.
func TestStopAndReadyHooks(t *testing.T) {
	stop := make(chan struct{})
	svc := newFake()
	readied := make(chan struct{})
	oc, ec, lb := run(t, Options{Name: "serve", signals: make(chan os.Signal, 1), Stop: stop,
		StopReason: func() string { return "handed off to pid 7" },
		Ready:      func(context.Context) error { close(readied); return nil }}, svc)
	<-readied
	close(svc.busy)
	close(stop)
	if o, err := wait(t, oc, ec, 5*time.Second); o != Drained || err != nil {
		t.Fatalf("got %v, %v; want drained", o, err)
	}
	if !strings.Contains(lb.String(), `signal="handed off to pid 7"`) {
		t.Fatalf("log lacks the stop reason:\n%s", lb.String())
	}

	svc = newFake()
	boom := errors.New("commit failed")
	oc, ec, _ = run(t, Options{signals: make(chan os.Signal, 1), Ready: func(context.Context) error { return boom }}, svc)
	if o, err := wait(t, oc, ec, 5*time.Second); o != Stopped || !errors.Is(err, boom) || svc.shutdowns != 1 {
		t.Fatalf("got %v, %v, %d shutdowns; want stopped, the Ready error, 1", o, err, svc.shutdowns)
	}
}

// A closed terminal (SIGHUP) drains instead of killing the process.
func TestRealSIGHUP(t *testing.T) {
	svc := newFake()
	close(svc.busy)
	o, err := runO(context.Background(), Options{Logger: slog.New(slog.NewTextHandler(&testutil.Buffer{}, nil))},
		func(context.Context, []*handoff.Listener) (Service, error) {
			return svc, syscall.Kill(os.Getpid(), syscall.SIGHUP)
		})
	if o != Drained || err != nil {
		t.Fatalf("got %v, %v", o, err)
	}
}

// A SIGPIPE raised by a write to a socket whose peer is gone (a client that
// closed while its reply was on the way) is no stop signal: with SIGPIPE
// caught, Go delivers it for every fd, and taking it as one drained the
// server (or cut a handoff's drain short, resetting connections with
// requests unread). Real signals: the process writes to a closed socketpair.
func TestSIGPIPEFromSocketDoesNotStop(t *testing.T) {
	stop := make(chan struct{})
	svc := newFake()
	close(svc.busy)
	oc, ec, lb := run(t, Options{Stop: stop}, svc)
	time.Sleep(50 * time.Millisecond) // Run has called signal.Notify
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fds[1])
	defer syscall.Close(fds[0])
	for range 3 {
		if _, err := syscall.Write(fds[0], []byte("x")); err != syscall.EPIPE {
			t.Fatalf("write to a closed socketpair: %v, want EPIPE", err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if strings.Contains(lb.String(), "draining") {
		t.Fatalf("a SIGPIPE from a socket write started a drain:\n%s", lb)
	}
	close(stop)
	if o, err := wait(t, oc, ec, 5*time.Second); o != Drained || err != nil {
		t.Fatalf("got %v, %v; want drained", o, err)
	}
}

// A SIGPIPE with stdout and stderr intact is dropped; one with a broken
// output drains (TestSecondSignalCutsShort).
func TestSIGPIPEWithIntactOutputIgnored(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	stop := make(chan struct{})
	svc := newFake()
	close(svc.busy)
	oc, ec, lb := run(t, Options{signals: sigs, Stop: stop, outputBroken: func() bool { return false }}, svc)
	sigs <- syscall.SIGPIPE
	time.Sleep(100 * time.Millisecond)
	if strings.Contains(lb.String(), "draining") {
		t.Fatalf("SIGPIPE with intact output started a drain:\n%s", lb)
	}
	sigs <- syscall.SIGTERM
	if o, err := wait(t, oc, ec, 5*time.Second); o != Drained || err != nil {
		t.Fatalf("got %v, %v; want drained", o, err)
	}
	if !strings.Contains(lb.String(), "signal=terminated") {
		t.Errorf("the drain was not started by SIGTERM:\n%s", lb)
	}
}

func TestFdsBroken(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if fdsBroken(int(w.Fd())) {
		t.Fatal("a pipe with its reader open polls broken")
	}
	r.Close()
	if !fdsBroken(int(w.Fd())) {
		t.Fatal("a pipe whose reader closed does not poll broken")
	}
}

// lingerService is a fakeService that lingers until clients is closed.
type lingerService struct {
	*fakeService
	clients  chan struct{}
	lingered chan time.Duration // the minGrace Linger got
}

func (l *lingerService) Linger(ctx context.Context, minGrace time.Duration) error {
	l.lingered <- minGrace
	select {
	case <-l.clients:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newLinger returns a lingerService; with stay, a client is still open at
// Shutdown (Shutdown then waits for its ctx).
func newLinger(stay bool) *lingerService {
	f := newFake()
	if !stay {
		close(f.busy) // Shutdown after the linger finds nothing open
	}
	return &lingerService{fakeService: f, clients: make(chan struct{}), lingered: make(chan time.Duration, 1)}
}

func runService(t *testing.T, opts Options, svc Service) (chan Outcome, chan error, *testutil.Buffer) {
	t.Helper()
	lb := &testutil.Buffer{}
	opts.Logger = slog.New(slog.NewTextHandler(lb, nil))
	oc, ec := make(chan Outcome, 1), make(chan error, 1)
	go func() {
		o, err := runO(context.Background(), opts, func(context.Context, []*handoff.Listener) (Service, error) { return svc, nil })
		oc <- o
		ec <- err
	}()
	return oc, ec, lb
}

// DrainLinger: Linger runs first with MinGrace (Shutdown only after it),
// the drain ends when the clients are gone, and the log says which mode.
func TestLingerWaitsForClients(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	svc := newLinger(false)
	var notes []string
	var mu sync.Mutex
	oc, ec, lb := runService(t, Options{Name: "serve", Drain: DrainLinger, MinGrace: 3 * time.Second, DrainTimeout: time.Minute, signals: sigs,
		Notify: func(s string) error { mu.Lock(); notes = append(notes, s); mu.Unlock(); return nil }}, svc)
	sigs <- syscall.SIGTERM
	if g := <-svc.lingered; g != 3*time.Second {
		t.Fatalf("Linger got min grace %v, want 3s", g)
	}
	select {
	case <-oc:
		t.Fatal("Run returned while clients were still connected")
	case <-time.After(100 * time.Millisecond):
	}
	if svc.shutdowns != 0 {
		t.Fatal("Shutdown called while lingering")
	}
	close(svc.clients)
	if o, err := wait(t, oc, ec, 5*time.Second); o != Drained || err != nil {
		t.Fatalf("got %v, %v; want drained", o, err)
	}
	log := lb.String()
	for _, want := range []string{"serve draining (linger)", "min_grace=3s", "no client left", "serve drained; stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notes) != 1 || notes[0] != "STOPPING=1" {
		t.Errorf("systemd notifications %q, want [STOPPING=1]", notes)
	}
}

// A linger that never ends (a client that stays) ends at the drain
// timeout; a second signal cuts it at once.
func TestLingerTimeoutAndSecondSignal(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	svc := newLinger(true)
	oc, ec, _ := runService(t, Options{Drain: DrainLinger, DrainTimeout: 300 * time.Millisecond, signals: sigs}, svc)
	start := time.Now()
	sigs <- syscall.SIGTERM
	if o, err := wait(t, oc, ec, 5*time.Second); o != TimedOut || err != nil {
		t.Fatalf("got %v, %v; want timed out", o, err)
	}
	if el := time.Since(start); el < 280*time.Millisecond {
		t.Errorf("returned after %v, before the 300ms drain timeout", el)
	}

	sigs = make(chan os.Signal, 2)
	svc = newLinger(true)
	oc, ec, lb := runService(t, Options{Drain: DrainLinger, DrainTimeout: time.Minute, signals: sigs}, svc)
	sigs <- syscall.SIGTERM
	<-svc.lingered
	start = time.Now()
	sigs <- os.Interrupt
	if o, err := wait(t, oc, ec, 5*time.Second); o != CutShort || err != nil {
		t.Fatalf("got %v, %v; want cut short", o, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("second signal took %v", el)
	}
	if !strings.Contains(lb.String(), "second signal") {
		t.Errorf("log lacks the second-signal line:\n%s", lb)
	}
}

// DrainLinger with a service that cannot linger fails at start, before
// serving, and closes the service.
func TestLingerNeedsLingerer(t *testing.T) {
	svc := newFake()
	_, err := Run(context.Background(), Options{Drain: DrainLinger, signals: make(chan os.Signal)},
		func(context.Context, []*handoff.Listener) (Service, error) { return svc, nil })
	if !errors.Is(err, ErrNoLinger) {
		t.Fatalf("got %v, want ErrNoLinger", err)
	}
	if svc.shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1 (closed at once)", svc.shutdowns)
	}
}

func TestOptionsErrors(t *testing.T) {
	start := func(context.Context, []*handoff.Listener) (Service, error) {
		t.Fatal("start called with bad options")
		return nil, nil
	}
	for _, o := range []Options{
		{Drain: DrainMode(7)},
		{Drain: DrainLinger, MinGrace: -time.Second},
		{Takeover: true, Control: ControlNone},
		{Takeover: true, Listen: []handoff.Spec{{Name: "rpc", Address: "tcp:127.0.0.1:0"}}},
	} {
		o.signals = make(chan os.Signal)
		_, err := Run(context.Background(), o, start)
		var oe *OptionsError
		if !errors.As(err, &oe) {
			t.Errorf("%+v: got %v, want an *OptionsError", o, err)
		}
	}
}

func TestControlPath(t *testing.T) {
	dir := t.TempDir()
	spec := func(addr string) []handoff.Spec { return []handoff.Spec{{Name: "a", Address: addr}} }
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Listen: spec(dir + "/x.sock")}, dir + "/x.sock.handoff"},
		{Options{Listen: spec("unix:" + dir + "/y.sock")}, dir + "/y.sock.handoff"},
		{Options{Listen: spec("tcp:127.0.0.1:0")}, ""},
		{Options{Listen: spec("/" + strings.Repeat("d", 100) + "/x.sock")}, ""}, // too long to derive
		{Options{Listen: spec(dir + "/x.sock"), Control: ControlNone}, ""},
		{Options{Listen: spec("tcp:127.0.0.1:0"), Control: dir + "/c"}, dir + "/c"},
		{Options{}, ""},
	} {
		got, err := c.o.ControlPath()
		if err != nil || got != c.want {
			t.Errorf("%+v: got %q, %v; want %q", c.o.Listen, got, err, c.want)
		}
	}
}

func TestParseDrainMode(t *testing.T) {
	for s, want := range map[string]DrainMode{"goaway": DrainGoaway, "": DrainGoaway, "linger": DrainLinger} {
		if m, err := ParseDrainMode(s); err != nil || m != want || (s != "" && m.String() != s) {
			t.Errorf("%q: got %v, %v", s, m, err)
		}
	}
	if _, err := ParseDrainMode("wait"); err == nil {
		t.Error("ParseDrainMode(wait) did not fail")
	}
}

// A Service made by Adapt runs its Serve(ctx) and stops by its Shutdown.
func TestAdapt(t *testing.T) {
	cs := &ctxService{stop: make(chan struct{})}
	sigs := make(chan os.Signal, 1)
	oc, ec, _ := runService(t, Options{signals: sigs}, Adapt(cs))
	sigs <- syscall.SIGTERM
	if o, err := wait(t, oc, ec, 5*time.Second); o != Drained || err != nil {
		t.Fatalf("got %v, %v", o, err)
	}
	if !cs.sawCtx {
		t.Error("Serve did not get a context")
	}
}

type ctxService struct {
	stop   chan struct{}
	sawCtx bool
}

func (c *ctxService) Serve(ctx context.Context) error {
	c.sawCtx = ctx != nil
	<-c.stop
	return nil
}

func (c *ctxService) Shutdown(context.Context) error { close(c.stop); return nil }

// NotifyContext ends at a real SIGTERM, not at a SIGPIPE raised by a write
// to a closed socket.
func TestNotifyContext(t *testing.T) {
	ctx, stop := NotifyContext(context.Background())
	defer stop()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fds[1])
	defer syscall.Close(fds[0])
	if _, err := syscall.Write(fds[0], []byte("x")); err != syscall.EPIPE {
		t.Fatalf("write to a closed socketpair: %v, want EPIPE", err)
	}
	select {
	case <-ctx.Done():
		t.Fatal("a SIGPIPE from a socket write ended the context")
	case <-time.After(200 * time.Millisecond):
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not end the context")
	}
	stop()
	stop() // twice is fine
}

package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/sdnotify"
)

// DefaultDrainTimeout is how long a drain may take when
// Options.DrainTimeout is zero.
const DefaultDrainTimeout = 5 * time.Second

// Signals are the signals that start a drain (the first) or end it at once
// (the second): Ctrl-C, kill, a closed terminal (SIGHUP), and a write to a
// closed pipe (SIGPIPE, e.g. output piped into a program that exited; Run
// ignores one raised by a write to a socket, see filterSignals).
// Without them the last two would kill the process with its socket file
// left behind.
var Signals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE}

// HelpText is the stop rules in the words every command's --help uses.
const HelpText = `SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGPIPE drains: stop accepting at once, let open
connections and in-flight calls finish for up to --drain-timeout (default 5s), then close the
rest. A second signal closes everything at once. A drain is a normal stop: exit status 0.`

// DrainMode says what a drain does with the clients.
type DrainMode int

const (
	// DrainGoaway stops accepting at once, sends goaway to udskit clients
	// (their later calls are refused as not processed and retried
	// elsewhere) and closes what is left at the drain timeout. For a handoff
	// or an upgrade, where another instance accepts already.
	DrainGoaway DrainMode = iota
	// DrainLinger keeps serving normally (accepting, no goaway) until no
	// client connection remains and MinGrace has passed, or until the drain
	// timeout. For a sidecar whose app is shutting down at the same time.
	DrainLinger
)

func (m DrainMode) String() string {
	switch m {
	case DrainGoaway:
		return "goaway"
	case DrainLinger:
		return "linger"
	}
	return fmt.Sprintf("DrainMode(%d)", int(m))
}

// ParseDrainMode parses "goaway" or "linger" (the --drain flag).
func ParseDrainMode(s string) (DrainMode, error) {
	switch s {
	case "goaway", "":
		return DrainGoaway, nil
	case "linger":
		return DrainLinger, nil
	}
	return 0, fmt.Errorf("drain mode %q: want goaway or linger", s)
}

// Service is what Run runs: Serve blocks until the service stops; Shutdown
// stops accepting, waits for open work until ctx ends, then closes what is
// left and returns ctx's error.
type Service interface {
	Serve() error
	Shutdown(ctx context.Context) error
}

// Lingerer is a Service that can drain in DrainLinger mode. Linger marks
// the service draining (its health method says so) but keeps it serving
// and accepting; it returns nil once no client connection is open and
// minGrace has passed since the call, or ctx's error when ctx ends first.
// Run calls Shutdown after it.
type Lingerer interface {
	Linger(ctx context.Context, minGrace time.Duration) error
}

// ContextService is a service whose Serve takes a context and stops when
// Shutdown is called (capture.Interposer). Adapt makes it a Service.
type ContextService interface {
	Serve(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// Adapt returns s as a Service: its Serve runs s.Serve with a context that
// is never canceled (Shutdown is what stops it).
func Adapt(s ContextService) Service { return adapted{s} }

type adapted struct{ ContextService }

func (a adapted) Serve() error { return a.ContextService.Serve(context.Background()) }

// Options configure Run. The zero value is the documented default: no
// listeners of Run's own, goaway drain, 5 s drain timeout.
type Options struct {
	// Name prefixes the log lines ("proxy draining ..."). Default "server".
	Name string

	// Listen, when set, are the listeners Run opens (or takes over) and
	// passes to start, in this order. Without it start opens its own, and
	// Takeover and Control do not apply.
	Listen []handoff.Spec
	// Takeover takes Listen over from the instance offering on Control
	// instead of binding fresh: no connection is refused, and the running
	// instance drains once this one serves.
	Takeover bool
	// Control is the control socket on which this instance offers its
	// listeners to a successor (and, with Takeover, where it takes them
	// from). Empty: the first unix path of Listen + ".handoff" (none when
	// Listen has no unix path); ControlNone: no handoffs.
	Control string
	// OnTakeover, when set, is called once a takeover committed, with its
	// timings (for a log line).
	OnTakeover func(*handoff.TakeoverResult)

	// Drain is what the drain does with clients: DrainGoaway (default) or
	// DrainLinger.
	Drain DrainMode
	// DrainTimeout bounds the drain, lingering included. 0: DefaultDrainTimeout.
	DrainTimeout time.Duration
	// MinGrace is the shortest a DrainLinger drain lasts, even with no
	// client connected (an app may still connect for its last calls).
	// Ignored by DrainGoaway.
	MinGrace time.Duration

	// Logger receives the drain lines. Default slog.Default().
	Logger *slog.Logger
	// Status, when set, returns key/value pairs (slog style) logged when the
	// drain starts and when it ends, e.g. open and total connections.
	Status func() []any
	// Notify sends the drain's systemd notification (STOPPING=1). Default
	// sdnotify.Notify, which does nothing without $NOTIFY_SOCKET.
	Notify func(state string) error

	// Ready, when set, runs once Serve has started (after a takeover has
	// committed). An error shuts the service down at once and is returned.
	Ready func(ctx context.Context) error
	// Stop, when set, starts the drain like a first signal once it is
	// closed; StopReason names it in the log.
	Stop       <-chan struct{}
	StopReason func() string

	// signals replaces the real signal channel in tests.
	signals chan os.Signal
	// outputBroken replaces stdioBroken in tests.
	outputBroken func() bool
}

// Outcome says how a service stopped.
type Outcome int

const (
	// Stopped: Serve returned on its own, without a signal.
	Stopped Outcome = iota
	// Drained: every connection finished within the drain timeout.
	Drained
	// TimedOut: the drain timeout passed; the rest were closed.
	TimedOut
	// CutShort: a second signal closed everything at once.
	CutShort
)

func (o Outcome) String() string {
	switch o {
	case Stopped:
		return "stopped"
	case Drained:
		return "drained"
	case TimedOut:
		return "drain timed out"
	case CutShort:
		return "cut short by a second signal"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result says how Run ended.
type Result struct {
	Outcome Outcome
	// HandedOff: a successor took the listeners over and serves from them
	// now; leave their socket files and directories alone.
	HandedOff bool
}

// ErrNoLinger is returned by Run for DrainLinger with a Service that does
// not implement Lingerer.
var ErrNoLinger = errors.New("service: DrainLinger needs a Service with a Linger method")

// Run catches Signals, gets the listeners of opts.Listen (fresh or taken
// over), calls start with them to make the service (start's context ends at
// the first signal), serves it and drains it by the package's rules. It
// returns how the service stopped and an error when the options are wrong
// (an *OptionsError) or the service failed to start or to serve; a drain,
// however it ends, is not an error.
func Run(ctx context.Context, opts Options, start func(ctx context.Context, ls []*handoff.Listener) (Service, error)) (Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctl, err := opts.ControlPath()
	if err != nil {
		return Result{}, err
	}
	if opts.Drain != DrainGoaway && opts.Drain != DrainLinger {
		return Result{}, &OptionsError{Field: "Drain", Problem: fmt.Sprintf("unknown mode %v", opts.Drain)}
	}
	if opts.MinGrace < 0 {
		return Result{}, &OptionsError{Field: "MinGrace", Problem: "cannot be negative"}
	}
	name := opts.Name
	if name == "" {
		name = "server"
	}
	timeout := opts.DrainTimeout
	if timeout <= 0 {
		timeout = DefaultDrainTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	notify := opts.Notify
	if notify == nil {
		notify = sdnotify.Notify
	}
	status := func(extra ...any) []any {
		if opts.Status != nil {
			extra = append(extra, opts.Status()...)
		}
		return extra
	}
	raw := opts.signals
	if raw == nil {
		raw = make(chan os.Signal, 2)
		signal.Notify(raw, Signals...)
		defer signal.Stop(raw)
	}
	broken := opts.outputBroken
	if broken == nil {
		broken = stdioBroken
	}
	sigs := make(chan os.Signal, 2)
	quit := make(chan struct{})
	defer close(quit)
	go filterSignals(raw, sigs, quit, broken)

	ho := &handoffRun{log: log, ctl: ctl, takeover: opts.Takeover, onTakeover: opts.OnTakeover,
		committed: make(chan struct{}), done: make(chan struct{})}
	defer ho.close()

	// The first signal (or ctx, Stop, a successor's commit) cancels
	// startCtx: it aborts a start in progress and, once serving, begins the
	// drain.
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	type stopEvent struct {
		reason    string
		handedOff bool // a successor took the listeners over
	}
	first := make(chan stopEvent, 1)
	go func() {
		select {
		case s := <-sigs:
			first <- stopEvent{reason: s.String()}
		case <-startCtx.Done():
			first <- stopEvent{reason: "context done"}
		case <-opts.Stop:
			reason := "stop requested"
			if opts.StopReason != nil {
				reason = opts.StopReason()
			}
			first <- stopEvent{reason: reason}
		case <-ho.committed:
			first <- stopEvent{reason: fmt.Sprintf("handed off to pid %d", ho.hp.Successor().PID), handedOff: true}
		}
		stopStart()
	}()
	res := func(o Outcome) Result { return Result{Outcome: o, HandedOff: ho.handedOff.Load()} }

	var ls []*handoff.Listener
	if len(opts.Listen) > 0 {
		if ls, err = ho.start(startCtx, opts.Listen); err != nil {
			return res(Stopped), err
		}
	}
	svc, err := start(startCtx, ls)
	if err != nil {
		return res(Stopped), err
	}
	var lingerer Lingerer
	if opts.Drain == DrainLinger {
		var ok bool
		if lingerer, ok = svc.(Lingerer); !ok {
			closeNow(svc)
			return res(Stopped), fmt.Errorf("%w (%T has none)", ErrNoLinger, svc)
		}
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve() }()
	ready := func(ctx context.Context) error {
		if err := ho.ready(ctx); err != nil {
			return err
		}
		if opts.Ready != nil {
			return opts.Ready(ctx)
		}
		return nil
	}
	if err := ready(startCtx); err != nil {
		closeNow(svc)
		<-served
		return res(Stopped), err
	}
	var ev stopEvent
	select {
	case err := <-served:
		return res(Stopped), err
	case ev = <-first:
	}
	reason := ev.reason
	if ev.handedOff {
		// The successor accepts on the same sockets: clients should move to
		// it now, not linger here.
		lingerer = nil
	}

	if err := notify("STOPPING=1"); err != nil {
		log.Warn("systemd notify failed", "err", err)
	}
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cut := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			log.Warn("second signal: closing everything now", "signal", s.String())
			close(cut)
			cancel()
		case <-dctx.Done():
		}
	}()
	if lingerer != nil {
		log.Info(name+" draining (linger): serving on until every client has gone",
			status("signal", reason, "min_grace", opts.MinGrace.String(), "drain_timeout", timeout.String())...)
		if lingerer.Linger(dctx, opts.MinGrace) == nil {
			log.Info(name+" draining: no client left; stopping", status()...)
		}
	} else {
		log.Info(name+" draining: not accepting; waiting for open connections",
			status("signal", reason, "drain_timeout", timeout.String())...)
	}
	err = svc.Shutdown(dctx)
	serr := <-served
	select {
	case <-cut:
		log.Warn(name+" stopped: "+CutShort.String(), status()...)
		return res(CutShort), serr
	default:
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		log.Warn(name+" stopped: drain timeout: closed the remaining connections", status("drain_timeout", timeout.String())...)
		return res(TimedOut), serr
	case err != nil:
		return res(Drained), err
	}
	log.Info(name+" drained; stopped", status()...)
	return res(Drained), serr
}

// closeNow shuts svc down with a context that has already ended: it closes
// everything at once.
func closeNow(svc Service) {
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	svc.Shutdown(dead)
}

// OptionsError is a mistake in Options (or in the flags they came from).
type OptionsError struct {
	Field   string
	Problem string
}

func (e *OptionsError) Error() string { return "service: " + e.Field + ": " + e.Problem }

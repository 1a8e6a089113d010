package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/udskit/udskit/sdnotify"
)

// DefaultDrainTimeout is how long a drain waits for open connections when
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

// Service is what Run runs: Serve blocks until the service stops; Shutdown
// stops accepting, waits for open work until ctx ends, then closes what is
// left and returns ctx's error.
type Service interface {
	Serve() error
	Shutdown(ctx context.Context) error
}

// Options configure Run. The zero value is the documented default.
type Options struct {
	// Name prefixes the log lines ("proxy draining ..."). Default "server".
	Name string
	// DrainTimeout bounds the drain. 0: DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Logger receives the drain lines. Default slog.Default().
	Logger *slog.Logger
	// Status, when set, returns key/value pairs (slog style) logged when the
	// drain starts and when it ends, e.g. open and total connections.
	Status func() []any

	// Ready, when set, runs once Serve has started (a handoff commits here).
	// An error shuts the service down at once and is returned.
	Ready func(ctx context.Context) error
	// Stop, when set, starts the drain like a first signal once it is closed
	// (a handoff successor took over); StopReason names it in the log.
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

// Run catches Signals, calls start to open the service (start's context ends
// at the first signal), serves it and drains it by the package's rules. It
// returns how the service stopped and start's or Serve's error, if any;
// a drain, however it ends, is not an error.
func Run(ctx context.Context, opts Options, start func(ctx context.Context) (Service, error)) (Outcome, error) {
	if ctx == nil {
		ctx = context.Background()
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

	// The first signal (or ctx) cancels startCtx: it aborts a start in
	// progress and, once serving, begins the drain.
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	first := make(chan string, 1)
	go func() {
		select {
		case s := <-sigs:
			first <- s.String()
		case <-startCtx.Done():
			first <- "context done"
		case <-opts.Stop:
			reason := "stop requested"
			if opts.StopReason != nil {
				reason = opts.StopReason()
			}
			first <- reason
		}
		stopStart()
	}()

	svc, err := start(startCtx)
	if err != nil {
		return Stopped, err
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve() }()
	if opts.Ready != nil {
		if err := opts.Ready(startCtx); err != nil {
			dead, cancel := context.WithCancel(context.Background())
			cancel()
			svc.Shutdown(dead)
			<-served
			return Stopped, err
		}
	}
	var reason string
	select {
	case err := <-served:
		return Stopped, err
	case reason = <-first:
	}

	if err := sdnotify.Stopping(); err != nil {
		log.Warn("systemd notify failed", "err", err)
	}
	log.Info(name+" draining: not accepting; waiting for open connections",
		status("signal", reason, "drain_timeout", timeout.String())...)
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
	err = svc.Shutdown(dctx)
	serr := <-served
	select {
	case <-cut:
		log.Warn(name+" stopped: "+CutShort.String(), status()...)
		return CutShort, serr
	default:
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		log.Warn(name+" stopped: drain timeout: closed the remaining connections", status("drain_timeout", timeout.String())...)
		return TimedOut, serr
	case err != nil:
		return Drained, err
	}
	log.Info(name+" drained; stopped", status()...)
	return Drained, serr
}

// filterSignals forwards the signals that stop the service from raw to
// stops until quit is closed, dropping (like signal.Notify) what does not
// fit in stops.
//
// SIGPIPE stops the service only when stdout or stderr lost its reader
// (broken). Once SIGPIPE is caught with signal.Notify, Go delivers it for a
// write to ANY file descriptor whose peer is gone, and a server writes to
// such sockets all the time: a client that closes its connection while a
// reply or a goaway is on its way. That write already fails with EPIPE and
// costs the server that one connection; taken as a signal it started a
// drain of the whole server, or, during a drain (a handoff), cut it short
// and reset every connection with requests still unread (calls lost in
// TestHandoffChainUnderLoad).
func filterSignals(raw <-chan os.Signal, stops chan<- os.Signal, quit <-chan struct{}, broken func() bool) {
	for {
		select {
		case s := <-raw:
			if s == syscall.SIGPIPE && !broken() {
				continue
			}
			select {
			case stops <- s:
			default:
			}
		case <-quit:
			return
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/internal/lifecycle"
	"github.com/udskit/udskit/uds"
)

// handoffFlags are the zero-downtime takeover flags shared by serve and proxy.
type handoffFlags struct {
	takeover bool
	socket   string
	detach   bool
}

func (h *handoffFlags) add(f *pflag.FlagSet) {
	f.BoolVar(&h.takeover, "handoff", false, "take the listening sockets over from the instance running now (no connection refused), then let it drain and exit")
	f.StringVar(&h.socket, "handoff-socket", "", "control socket on which a later --handoff takes over from this instance (default: the first unix listen path + .handoff; none: do not offer)")
	f.BoolVar(&h.detach, "detach", false, "with --handoff: run the new instance in the background and exit once it has taken over (for systemd ExecReload=)")
}

// noHandoff is the --handoff-socket value that turns offering off.
const noHandoff = "none"

// maxDerivedControl keeps a derived control path within every OS's
// sun_path (104 bytes on macOS, terminator included).
const maxDerivedControl = 103

// control returns the control socket path: --handoff-socket, else the first
// unix path address + ".handoff", else "" (no handoffs: TCP, abstract or
// passed addresses without --handoff-socket, or --handoff-socket none).
func (h *handoffFlags) control(addrs ...string) (string, error) {
	if h.detach && !h.takeover {
		return "", errors.New("--detach goes with --handoff")
	}
	switch h.socket {
	case noHandoff:
		if h.takeover {
			return "", errors.New("--handoff needs a control socket; --handoff-socket none turns it off")
		}
		return "", nil
	case "":
	default:
		return h.socket, nil
	}
	for _, s := range addrs {
		if a, err := uds.ParseAddr(s); err == nil && a.Kind == uds.Unix {
			if ctl := handoff.ControlPath(a.Name); len(ctl) <= maxDerivedControl {
				return ctl, nil
			}
			break
		}
	}
	if h.takeover {
		return "", errors.New("--handoff: give --handoff-socket (the running instance's control socket); it cannot be derived from these addresses")
	}
	return "", nil // nothing to derive it from: this instance cannot be taken over
}

// runDetached re-runs this command without --detach as a background
// successor and returns once it has taken over.
func (h *handoffFlags) runDetached(ctx context.Context) error {
	var args []string
	for _, a := range os.Args[1:] {
		if a != "--detach" && a != "--detach=true" {
			args = append(args, a)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := handoff.RunDetached(ctx, args); err != nil {
		return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
	}
	return nil
}

// handoffRun wires a handoff.Process into lifecycle.Run for serve and proxy.
type handoffRun struct {
	flags     *handoffFlags
	out       io.Writer
	ctl       string
	hp        *handoff.Process
	stop      chan struct{} // closed when a successor committed
	done      chan struct{} // closed by close
	handedOff atomic.Bool
}

// prepare finds the control socket (from --handoff-socket or the first unix
// path of addrs). With --detach it runs the successor in the background
// and says the command is done.
func (h *handoffRun) prepare(ctx context.Context, addrs ...string) (done bool, err error) {
	if h.ctl, err = h.flags.control(addrs...); err != nil {
		return true, usage(err)
	}
	if h.flags.detach {
		return true, h.flags.runDetached(ctx)
	}
	return false, nil
}

// options adds the commit (Ready) and the successor's takeover (Stop) to o.
func (h *handoffRun) options(o lifecycle.Options) lifecycle.Options {
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	o.Ready, o.Stop = h.ready, h.stop
	o.StopReason = func() string { return fmt.Sprintf("handed off to pid %d", h.hp.Successor().PID) }
	return o
}

// start listens on specs, or takes them over with --handoff.
func (h *handoffRun) start(ctx context.Context, log *slog.Logger, specs ...handoff.Spec) ([]*handoff.Listener, error) {
	hp, err := handoff.Start(ctx, specs, handoff.ProcessOptions{Control: h.ctl, Takeover: h.flags.takeover, Logger: log})
	if err != nil {
		return nil, err
	}
	h.hp = hp
	ls := make([]*handoff.Listener, len(specs))
	for i, s := range specs {
		ls[i] = hp.Listener(s.Name)
	}
	return ls, nil
}

func (h *handoffRun) ready(ctx context.Context) error {
	res, err := h.hp.Ready(ctx)
	if err != nil {
		return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
	}
	if res != nil {
		fmt.Fprintln(h.out, res.String())
	}
	go func() {
		select {
		case <-h.hp.Committed():
			h.handedOff.Store(true)
			close(h.stop)
		case <-h.done:
		}
	}()
	return nil
}

// close stops offering.
func (h *handoffRun) close() {
	if h.done != nil {
		close(h.done)
	}
	if h.hp != nil {
		h.hp.Close()
	}
}

// unlessHandedOff runs f (removing a private socket dir) unless a successor
// now serves from it.
func (h *handoffRun) unlessHandedOff(f func()) {
	if !h.handedOff.Load() {
		f()
	}
}

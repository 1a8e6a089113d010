package service

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/uds"
)

// ControlNone as Options.Control turns handoffs off: this instance neither
// takes over nor offers.
const ControlNone = "none"

// maxDerivedControl keeps a derived control path within every OS's
// sun_path (104 bytes on macOS, terminator included).
const maxDerivedControl = 103

// ControlPath returns the control socket Run uses: Control, else the first
// unix path of Listen + ".handoff", else "" (no handoffs: TCP, abstract or
// passed addresses without a Control, or ControlNone). An *OptionsError
// when Takeover has no control socket to take over from.
func (o Options) ControlPath() (string, error) {
	switch o.Control {
	case ControlNone:
		if o.Takeover {
			return "", &OptionsError{Field: "Takeover", Problem: "a takeover needs a control socket, and Control is none (handoffs off)"}
		}
		return "", nil
	case "":
	default:
		return o.Control, nil
	}
	for _, s := range o.Listen {
		if a, err := uds.ParseAddr(s.Address); err == nil && a.Kind == uds.Unix {
			if ctl := handoff.ControlPath(a.Name); len(ctl) <= maxDerivedControl {
				return ctl, nil
			}
			break
		}
	}
	if o.Takeover {
		return "", &OptionsError{Field: "Control", Problem: "a takeover needs the running instance's control socket, and it cannot be derived from these addresses (give it: --handoff-socket)"}
	}
	return "", nil // nothing to derive it from: this instance cannot be taken over
}

// Detach runs args (this program's arguments, without the one that asked
// for detaching) as a background successor that takes the listeners over,
// and returns once it has committed, or with the error that stopped it:
// for systemd's ExecReload= (handoff.RunDetached).
func Detach(ctx context.Context, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := handoff.RunDetached(ctx, args); err != nil {
		return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
	}
	return nil
}

// handoffRun is Run's part of package handoff: listeners from a
// handoff.Process, the commit once serving, and the successor's takeover.
type handoffRun struct {
	log        *slog.Logger
	ctl        string
	takeover   bool
	onTakeover func(*handoff.TakeoverResult)
	hp         *handoff.Process
	committed  chan struct{} // closed when a successor committed
	done       chan struct{} // closed by close
	handedOff  atomic.Bool
}

// start listens on specs, or takes them over.
func (h *handoffRun) start(ctx context.Context, specs []handoff.Spec) ([]*handoff.Listener, error) {
	hp, err := handoff.Start(ctx, specs, handoff.ProcessOptions{Control: h.ctl, Takeover: h.takeover, Logger: h.log})
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

// ready commits a takeover, starts offering and tells systemd; then it
// watches for a successor.
func (h *handoffRun) ready(ctx context.Context) error {
	if h.hp == nil {
		return nil
	}
	res, err := h.hp.Ready(ctx)
	if err != nil {
		return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
	}
	if res != nil && h.onTakeover != nil {
		h.onTakeover(res)
	}
	go func() {
		select {
		case <-h.hp.Committed():
			h.handedOff.Store(true)
			close(h.committed)
		case <-h.done:
		}
	}()
	return nil
}

// close stops offering.
func (h *handoffRun) close() {
	close(h.done)
	if h.hp != nil {
		h.hp.Close()
	}
}

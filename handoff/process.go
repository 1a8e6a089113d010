package handoff

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/udskit/udskit/sdnotify"
	"github.com/udskit/udskit/uds"
)

// Spec names one listener a Process serves: where to listen on a fresh
// start, and the name it is offered and taken under.
type Spec struct {
	Name    string
	Address string // ignored when taking over (the socket comes from the predecessor)
	Listen  uds.ListenOptions
}

// ProcessOptions configures Start. The zero value listens fresh and offers
// nothing.
type ProcessOptions struct {
	// Control is the control socket path. Empty: no handoffs (neither taking
	// over nor offering).
	Control string
	// Takeover takes the listeners over from the process offering on
	// Control instead of listening on the Spec addresses.
	Takeover bool
	// Acquire and Offer tune the two sides; their Control and Logger are
	// filled in.
	Acquire AcquireOptions
	Offer   OfferOptions
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

// Process is one server process's part in a chain of handoffs: it gets its
// listeners (fresh, or from its predecessor), and once it serves (Ready)
// commits the takeover, offers the listeners to its own successor, and
// tells systemd. Committed fires when a successor took over: drain then.
type Process struct {
	opts      ProcessOptions
	log       *slog.Logger
	acq       *Acquired
	listeners []*Listener
	byName    map[string]*Listener
	off       *Offerer
	ready     sync.Once
	never     chan struct{}
}

// TakeoverResult describes a completed takeover.
type TakeoverResult struct {
	Predecessor uds.Cred
	// Offered is from the start of Acquire until the offer arrived.
	Offered time.Duration
	// Serving is the handoff time: from the start of Acquire until every
	// listener was being accepted on in this process.
	Serving time.Duration
	// Confirmed is when the predecessor confirmed it stopped accepting, also
	// from the start of Acquire.
	Confirmed time.Duration
}

// Start gets the listeners: taken over from the predecessor on Control when
// Takeover is set (every Spec name must be offered), else bound fresh.
func Start(ctx context.Context, specs []Spec, opts ProcessOptions) (*Process, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Process{opts: opts, log: opts.Logger, byName: map[string]*Listener{}, never: make(chan struct{})}
	if opts.Takeover {
		if opts.Control == "" {
			return nil, errors.New("handoff: taking over needs the control socket path")
		}
		for _, s := range specs {
			if err := checkNotTLS(s); err != nil {
				return nil, err // before asking: the running process is left alone
			}
		}
		ao := opts.Acquire
		if ao.Logger == nil {
			ao.Logger = opts.Logger
		}
		a, err := Acquire(ctx, opts.Control, ao)
		if err != nil {
			return nil, err
		}
		p.acq = a
		for _, s := range specs {
			l, err := a.Listener(s.Name, s.Listen)
			if err != nil {
				a.Abort(err.Error())
				return nil, err
			}
			p.add(l)
		}
		return p, nil
	}
	for _, s := range specs {
		l, err := Listen(ctx, s.Name, s.Address, s.Listen)
		if err != nil {
			p.closeAll()
			return nil, err
		}
		p.add(l)
	}
	return p, nil
}

func (p *Process) add(l *Listener) {
	p.listeners = append(p.listeners, l)
	p.byName[l.name] = l
}

func (p *Process) closeAll() {
	for _, l := range p.listeners {
		l.Close()
	}
}

// Listener returns the listener for a Spec name (nil if there is none).
func (p *Process) Listener(name string) *Listener { return p.byName[name] }

// State is the predecessor's state blob (nil on a fresh start).
func (p *Process) State() []byte {
	if p.acq == nil {
		return nil
	}
	return p.acq.State()
}

// Abort gives a takeover up before Ready: the predecessor serves on.
func (p *Process) Abort(reason string) {
	if p.acq != nil {
		p.acq.Abort(reason)
	} else {
		p.closeAll()
	}
}

// Ready is called once the server is serving on every listener (Accept
// called). It commits a takeover (waiting for the listeners to be accepted
// on, bounded by ctx), reports to a detached launcher, starts offering on
// Control, and notifies systemd (READY=1, or MAINPID= after a takeover).
// The result is nil on a fresh start.
func (p *Process) Ready(ctx context.Context) (*TakeoverResult, error) {
	var res *TakeoverResult
	var err error
	p.ready.Do(func() { res, err = p.readyOnce(ctx) })
	return res, err
}

func (p *Process) readyOnce(ctx context.Context) (*TakeoverResult, error) {
	var res *TakeoverResult
	if p.acq != nil {
		serving, err := p.acq.Commit(ctx)
		if err != nil {
			reportDetached("error: " + err.Error())
			return nil, err
		}
		res = &TakeoverResult{Predecessor: p.acq.Peer(), Offered: p.acq.offered, Serving: serving, Confirmed: time.Since(p.acq.start)}
	}
	if p.opts.Control != "" {
		oo := p.opts.Offer
		oo.Control = p.opts.Control
		if oo.Logger == nil {
			oo.Logger = p.log
		}
		if oo.OnCommit == nil {
			// This process is systemd's main pid, so it may name its
			// successor (NotifyAccess=main is enough), before it exits.
			oo.OnCommit = func(c uds.Cred) {
				if err := sdnotify.Notify("MAINPID=" + strconv.Itoa(int(c.PID))); err != nil {
					p.log.Warn("handoff: systemd notify failed", "err", err)
				}
			}
		}
		off, err := Offer(ctx, p.listeners, oo)
		if err != nil {
			// Serving matters more than being replaceable: say so, go on.
			p.log.Error("handoff: cannot offer to a successor", "err", err)
		} else {
			p.off = off
		}
	}
	if res != nil {
		reportDetached("committed " + strconv.FormatInt(res.Serving.Nanoseconds(), 10))
		if err := sdnotify.MainPID(os.Getpid()); err != nil {
			p.log.Warn("handoff: systemd notify failed", "err", err)
		}
	} else if err := sdnotify.Ready(); err != nil {
		p.log.Warn("handoff: systemd notify failed", "err", err)
	}
	return res, nil
}

// Committed is closed when a successor has taken over: stop (drain) now.
// It never fires in a process that does not offer.
func (p *Process) Committed() <-chan struct{} {
	if p.off == nil {
		return p.never
	}
	return p.off.Committed()
}

// Successor is the process that took over (after Committed).
func (p *Process) Successor() uds.Cred {
	if p.off == nil {
		return uds.Cred{}
	}
	return p.off.Successor()
}

// Close stops offering (removing the control socket). The listeners are the
// server's to close.
func (p *Process) Close() error {
	if p.off != nil {
		return p.off.Close()
	}
	return nil
}

// String is a one-line summary of a takeover for logs and CLIs.
func (r *TakeoverResult) String() string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return fmt.Sprintf("took over from pid %d: serving %.2f ms after acquire (offer in %.2f ms), predecessor stopped accepting at %.2f ms",
		r.Predecessor.PID, ms(r.Serving), ms(r.Offered), ms(r.Confirmed))
}

package handoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/udskit/udskit/uds"
)

// OfferOptions configures Offer. The zero value is the safe default apart
// from Control, which is required.
type OfferOptions struct {
	// Control is the control socket's path (e.g. ControlPath of the service
	// socket). It is created owner-only (Mode) with uds.Listen's hygiene.
	Control string
	// Mode is the control socket's permission bits. Default 0600.
	Mode os.FileMode
	// Policy decides who may acquire, from kernel credentials, before a byte
	// is read. Default uds.AllowSameUser().
	Policy uds.Policy
	// State, when set, is called for each acquirer and its result is sent
	// with the listeners (at most MaxState bytes).
	State func() ([]byte, error)
	// MaxState caps the state blob. Default DefaultMaxState, at most
	// HardMaxState.
	MaxState int
	// CommitTimeout is how long an acquirer may take from the offer to its
	// commit. Past it the offer is withdrawn and this process serves on as
	// if nothing happened. Default 10s.
	CommitTimeout time.Duration
	// ReleaseGrace bounds the wait, at commit, for each serving loop to come
	// back to Accept. Default 1s.
	ReleaseGrace time.Duration
	// OnCommit, when set, runs at the commit, after the listeners stopped
	// accepting and before the successor is told: e.g. to tell systemd the
	// service's main pid is now the successor's (sdnotify.MainPID).
	OnCommit func(successor uds.Cred)
	// Logger receives session notes. Default slog.Default().
	Logger *slog.Logger
}

// ControlPath is the conventional control socket beside a service socket
// path: PATH.handoff.
func ControlPath(servicePath string) string { return servicePath + ".handoff" }

// Offerer offers a process's listeners to one successor at a time.
//
// States: offering -> (session: hello -> offered -> committed | back to
// offering on abort, timeout, a dead or misbehaving acquirer) -> committed
// or closed. At most one session runs (mu guards session); others get
// ERROR busy. Listeners are touched only on commit.
type Offerer struct {
	opts      OfferOptions
	log       *slog.Logger
	ctl       *uds.Listener
	listeners []*Listener

	mu        sync.Mutex
	session   bool
	committed bool
	successor uds.Cred
	done      chan struct{} // closed on commit
	closed    chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// Offer binds the control socket and offers listeners on it until a
// successor commits (Committed) or Close. Names must be unique.
func Offer(ctx context.Context, listeners []*Listener, opts OfferOptions) (*Offerer, error) {
	if opts.Control == "" {
		return nil, errors.New("handoff: OfferOptions.Control (the control socket path) is required")
	}
	if len(listeners) == 0 || len(listeners) > MaxListeners {
		return nil, fmt.Errorf("handoff: offer 1 to %d listeners, not %d", MaxListeners, len(listeners))
	}
	seen := map[string]bool{}
	for _, l := range listeners {
		if seen[l.name] {
			return nil, fmt.Errorf("handoff: listener name %q twice", l.name)
		}
		seen[l.name] = true
	}
	if opts.Policy == nil {
		opts.Policy = uds.AllowSameUser()
	}
	if opts.MaxState <= 0 {
		opts.MaxState = DefaultMaxState
	}
	opts.MaxState = min(opts.MaxState, HardMaxState)
	if opts.CommitTimeout <= 0 {
		opts.CommitTimeout = 10 * time.Second
	}
	if opts.ReleaseGrace <= 0 {
		opts.ReleaseGrace = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctl, err := uds.Listen(ctx, "unix:"+opts.Control, uds.ListenOptions{Mode: opts.Mode, Policy: opts.Policy, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("handoff: control socket: %w", err)
	}
	o := &Offerer{opts: opts, log: opts.Logger, ctl: ctl, listeners: listeners,
		done: make(chan struct{}), closed: make(chan struct{})}
	o.wg.Add(1)
	go o.acceptLoop()
	return o, nil
}

// Committed is closed when a successor has committed: this process's
// listeners no longer accept and it should drain and exit.
func (o *Offerer) Committed() <-chan struct{} { return o.done }

// Successor is the committed successor's kernel credentials.
func (o *Offerer) Successor() uds.Cred {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.successor
}

// Close stops offering and removes the control socket. A session in
// progress is cut off (its acquirer gets an error; nothing changes here).
func (o *Offerer) Close() error {
	o.closeOnce.Do(func() { close(o.closed) })
	err := o.ctl.Close()
	o.wg.Wait()
	return err
}

func (o *Offerer) acceptLoop() {
	defer o.wg.Done()
	for {
		c, err := o.ctl.Accept()
		if err != nil {
			select {
			case <-o.closed:
				return
			case <-o.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			o.log.Warn("handoff: control accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		o.mu.Lock()
		busy := o.session || o.committed
		if !busy {
			o.session = true
		}
		o.mu.Unlock()
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			if busy {
				refuse(c, codeBusy, "another process is taking over right now")
				c.Close()
				return
			}
			committed := o.serveSession(c)
			o.mu.Lock()
			o.session = false
			o.mu.Unlock()
			c.Close() // after the session is free: a peer seeing EOF may acquire at once
			if committed {
				close(o.done)
			}
		}()
	}
}

// refuse sends an ERROR frame and waits (up to a second) for the peer to
// close: closing a unix socket with unread input resets the peer, which
// could then lose the error before reading it. The caller closes c.
func refuse(c net.Conn, code uint16, msg string) {
	c.SetDeadline(time.Now().Add(time.Second))
	c.Write(encodeText(msgError, code, msg))
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 1<<16))
}

// serveSession runs one acquirer's handshake and reports whether it
// committed. Any failure before COMMIT leaves the listeners as they were.
func (o *Offerer) serveSession(nc net.Conn) (committed bool) {
	cr, _ := uds.CredOf(nc)
	log := o.log.With("acquirer_pid", cr.PID, "acquirer_uid", cr.UID)
	uc, ok := netUnix(nc)
	if !ok {
		return false
	}
	ended := make(chan struct{})
	defer close(ended)
	go func() { // Close cuts a session off
		select {
		case <-o.closed:
			nc.Close()
		case <-ended:
		}
	}()
	nc.SetDeadline(time.Now().Add(o.opts.CommitTimeout))
	typ, body, _, err := readFrame(uc, o.opts.MaxState, false)
	if err != nil || typ != msgHello {
		log.Warn("handoff: no valid hello; session dropped", "err", err, "type", typ)
		refuse(nc, codeProtocol, "expected hello")
		return false
	}
	h, err := decodeHello(body)
	if err != nil {
		refuse(nc, codeProtocol, err.Error())
		return false
	}
	if h.minV > maxVersion || h.maxV < minVersion {
		refuse(nc, codeVersion, fmt.Sprintf("protocol versions %d..%d not supported (this side speaks %d..%d)", h.minV, h.maxV, minVersion, maxVersion))
		return false
	}
	var state []byte
	if o.opts.State != nil {
		if state, err = o.opts.State(); err != nil || len(state) > o.opts.MaxState {
			log.Error("handoff: state callback failed; offer withdrawn", "err", err, "bytes", len(state))
			refuse(nc, codeInternal, "the offering process could not produce its state")
			return false
		}
	}
	off := offer{version: min(h.maxV, maxVersion), pid: uint32(os.Getpid()), state: state}
	fds := make([]int, 0, len(o.listeners))
	defer func() { closeFDs(fds) }()
	for _, l := range o.listeners {
		if l.UAddr().Kind == uds.TLS {
			log.Error("handoff: a tls: listener cannot be handed off; offer withdrawn", "name", l.name)
			refuse(nc, codeInternal, fmt.Sprintf("listener %q is %v: %s", l.name, l.UAddr(), tlsHandoffWhy))
			return false
		}
		fd, err := l.DupFD()
		if err != nil {
			log.Error("handoff: cannot duplicate a listener", "name", l.name, "err", err)
			refuse(nc, codeInternal, "the offering process could not duplicate its listeners")
			return false
		}
		fds = append(fds, fd)
		off.listeners = append(off.listeners, ListenerInfo{Name: l.name, Addr: l.UAddr()})
	}
	frame, err := encodeOffer(off)
	if err != nil {
		refuse(nc, codeInternal, err.Error())
		return false
	}
	if err := writeFrame(uc, frame, fds); err != nil {
		log.Warn("handoff: sending the offer failed", "err", err)
		return false
	}
	closeFDs(fds)
	fds = fds[:0]
	log.Info("handoff: listeners offered; waiting for commit", "who", h.who, "timeout", o.opts.CommitTimeout)
	typ, body, _, err = readFrame(uc, o.opts.MaxState, false)
	switch {
	case err != nil:
		log.Warn("handoff: acquirer gone or timed out before commit; serving on", "err", err)
		return false
	case typ == msgAbort:
		_, why, _ := decodeText(body)
		log.Info("handoff: acquirer aborted; serving on", "reason", why)
		return false
	case typ != msgCommit:
		log.Warn("handoff: unexpected message before commit; serving on", "type", typ)
		refuse(nc, codeProtocol, "expected commit or abort")
		return false
	}
	// Point of no return: stop accepting, free the control path for the
	// successor, then confirm.
	o.mu.Lock()
	o.committed, o.successor = true, cr
	o.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range o.listeners {
		wg.Add(1)
		go func() { defer wg.Done(); l.release(o.opts.ReleaseGrace) }()
	}
	wg.Wait()
	if o.opts.OnCommit != nil {
		o.opts.OnCommit(cr)
	}
	o.ctl.Close()
	if _, err := nc.Write(encodeEmpty(msgCommitted)); err != nil {
		log.Warn("handoff: committed, but the confirmation did not reach the successor", "err", err)
	}
	log.Info("handoff: committed; listeners released to the successor")
	return true
}

func netUnix(c net.Conn) (*net.UnixConn, bool) {
	if uc, ok := c.(*uds.Conn); ok {
		c = uc.NetConn()
	}
	u, ok := c.(*net.UnixConn)
	return u, ok
}

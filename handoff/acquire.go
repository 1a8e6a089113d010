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
	"syscall"
	"time"

	"github.com/udskit/udskit/uds"
)

// AcquireOptions configures Acquire. The zero value is the safe default.
type AcquireOptions struct {
	// Policy checks the offering process's kernel credentials before a
	// descriptor is accepted from it. Default uds.AllowSameUser().
	Policy uds.Policy
	// Name describes this process in the offerer's log. Default the
	// executable's name.
	Name string
	// MaxState caps the state blob accepted. Default DefaultMaxState.
	MaxState int
	// Logger receives notes. Default slog.Default().
	Logger *slog.Logger
}

// Acquired holds the listeners a predecessor offered, between Acquire and
// Commit or Abort.
//
// States: offered -> committed (listeners are this process's; their socket
// files too) | aborted (everything taken is closed, the predecessor serves
// on). While offered, both processes accept on the same sockets, and a
// taken listener's Close never removes its socket file.
type Acquired struct {
	conn    *net.UnixConn
	peer    uds.Cred
	log     *slog.Logger
	infos   []ListenerInfo
	state   []byte
	start   time.Time
	offered time.Duration // from start to the offer received

	mu      sync.Mutex
	fds     map[string]int       // offered and not yet taken
	taken   map[string]*Listener // taken by Listener
	settled bool                 // committed or aborted
}

// Acquire connects to a running process's control socket and takes its
// offer: named listeners and the state blob. Exactly one of several
// concurrent acquirers gets the offer; the others get ErrBusy. Serve on the
// listeners (Listener), then Commit; or Abort. If this process dies or does
// not commit within the offerer's CommitTimeout, the offerer serves on.
func Acquire(ctx context.Context, control string, opts AcquireOptions) (*Acquired, error) {
	start := time.Now()
	if opts.Policy == nil {
		opts.Policy = uds.AllowSameUser()
	}
	if opts.MaxState <= 0 {
		opts.MaxState = DefaultMaxState
	}
	opts.MaxState = min(opts.MaxState, HardMaxState)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("%s (pid %d)", exeName(), os.Getpid())
	}
	nc, err := uds.Dial(ctx, "unix:"+control, uds.DialOptions{})
	if err != nil {
		return nil, fmt.Errorf("handoff: no running instance to take over from: %w", err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, errors.New("handoff: control socket is not a unix socket")
	}
	a, err := handshake(ctx, uc, opts)
	if err != nil {
		uc.Close()
		return nil, err
	}
	a.start, a.offered = start, time.Since(start)
	return a, nil
}

func exeName() string {
	if exe, err := os.Executable(); err == nil {
		return exe
	}
	return os.Args[0]
}

func handshake(ctx context.Context, c *net.UnixConn, opts AcquireOptions) (*Acquired, error) {
	cr, err := uds.PeerCred(c)
	if err != nil {
		return nil, fmt.Errorf("handoff: offerer's credentials: %w", err)
	}
	if err := opts.Policy(cr); err != nil {
		return nil, fmt.Errorf("handoff: offering process %v: %w", cr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	_, werr := c.Write(encodeHello(hello{minV: minVersion, maxV: maxVersion, who: opts.Name}))
	// Even when the hello could not be written, an ERROR (busy) may be
	// waiting to be read.
	typ, body, fds, err := readFrame(c, opts.MaxState, true)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || werr != nil {
			return nil, fmt.Errorf("handoff: the running instance closed the control connection without an offer (its policy refuses this user, or it is stopping): %w", err)
		}
		return nil, fmt.Errorf("handoff: waiting for the offer: %w", ctxErr(ctx, err))
	}
	if typ == msgError {
		closeFDs(fds)
		code, msg, err := decodeText(body)
		if err != nil {
			return nil, err
		}
		return nil, &RemoteError{Code: code, Message: msg}
	}
	if typ != msgOffer {
		closeFDs(fds)
		return nil, protoErr("expected an offer, got message type %d", typ)
	}
	off, err := decodeOffer(body, len(fds), opts.MaxState)
	if err != nil {
		closeFDs(fds)
		return nil, err
	}
	if off.version < minVersion || off.version > maxVersion {
		closeFDs(fds)
		return nil, protoErr("offer in version %d, which this side did not ask for", off.version)
	}
	c.SetDeadline(time.Time{})
	a := &Acquired{conn: c, peer: cr, log: opts.Logger, infos: off.listeners, state: off.state,
		fds: map[string]int{}, taken: map[string]*Listener{}}
	for i, li := range off.listeners {
		a.fds[li.Name] = fds[i]
	}
	return a, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// Listeners describes what was offered, in the offerer's order.
func (a *Acquired) Listeners() []ListenerInfo { return append([]ListenerInfo(nil), a.infos...) }

// State is the offerer's state blob (nil when it sent none).
func (a *Acquired) State() []byte { return a.state }

// Peer is the offering process's kernel credentials.
func (a *Acquired) Peer() uds.Cred { return a.peer }

// Listener takes the offered listener called name, checked to be a
// listening stream socket bound where the offer says. opts supplies the
// Policy and Logger for accepted connections. Each name can be taken once;
// offered listeners not taken are closed at Commit or Abort.
func (a *Acquired) Listener(name string, opts uds.ListenOptions) (*Listener, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.settled {
		return nil, errors.New("handoff: already committed or aborted")
	}
	fd, ok := a.fds[name]
	if !ok {
		if _, dup := a.taken[name]; dup {
			return nil, fmt.Errorf("handoff: listener %q already taken", name)
		}
		return nil, fmt.Errorf("handoff: no listener %q offered (offered: %v)", name, a.names())
	}
	var want uds.Addr
	for _, li := range a.infos {
		if li.Name == name {
			want = li.Addr
		}
	}
	ul, err := uds.ListenFD(fd, opts)
	if err != nil {
		return nil, fmt.Errorf("handoff: listener %q: %w", name, err)
	}
	delete(a.fds, name)
	if got := ul.UAddr(); got != want && !(want.Kind == uds.TCP && got.Kind == uds.TCP) {
		ul.Close()
		return nil, fmt.Errorf("handoff: listener %q is bound to %v, but the offer says %v", name, got, want)
	}
	l := Wrap(name, ul)
	a.taken[name] = l
	return l, nil
}

func (a *Acquired) names() []string {
	out := make([]string, 0, len(a.infos))
	for _, li := range a.infos {
		out = append(out, li.Name)
	}
	return out
}

// ErrNotServing is returned by Commit when a taken listener has not been
// served on (no Accept call) by the time ctx ends.
var ErrNotServing = errors.New("handoff: commit refused: not every taken listener is being served (call Accept first)")

// Commit tells the predecessor to stop accepting and drain. It first waits
// until every taken listener is in Accept (this process serves), so no
// connection can sit unserved; then it waits for the predecessor's
// confirmation. After a nil return this process owns the listeners and
// their socket files. Serving returns HandoffTime: from Acquire's start to
// the moment every taken listener was being accepted on.
func (a *Acquired) Commit(ctx context.Context) (serving time.Duration, err error) {
	a.mu.Lock()
	if a.settled {
		a.mu.Unlock()
		return 0, errors.New("handoff: already committed or aborted")
	}
	taken := make([]*Listener, 0, len(a.taken))
	for _, l := range a.taken {
		taken = append(taken, l)
	}
	a.mu.Unlock()
	if len(taken) == 0 {
		return 0, errors.New("handoff: commit with no listener taken; Abort instead")
	}
	for _, l := range taken {
		select {
		case <-l.Accepting():
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %q", ErrNotServing, l.name)
		}
	}
	serving = time.Since(a.start)
	a.mu.Lock()
	a.settled = true
	a.mu.Unlock()
	defer a.finish()
	if dl, ok := ctx.Deadline(); ok {
		a.conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { a.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := a.conn.Write(encodeEmpty(msgCommit)); err != nil {
		return serving, fmt.Errorf("handoff: commit: %w", err)
	}
	typ, body, _, err := readFrame(a.conn, 0, false)
	if err != nil {
		return serving, fmt.Errorf("handoff: commit sent, no confirmation (the predecessor may have stopped or died): %w", ctxErr(ctx, err))
	}
	if typ == msgError {
		_, msg, _ := decodeText(body)
		return serving, &RemoteError{Message: msg}
	}
	if typ != msgCommitted {
		return serving, protoErr("expected committed, got message type %d", typ)
	}
	for _, l := range taken {
		if err := l.Listener.Own(); err != nil {
			a.log.Warn("handoff: cannot take the socket file over", "name", l.name, "err", err)
		}
	}
	return serving, nil
}

// Abort gives the offer back: every taken listener is closed (its socket
// file stays) and the predecessor serves on as if nothing happened.
// Connections this process already accepted are its own to finish.
func (a *Acquired) Abort(reason string) error {
	a.mu.Lock()
	if a.settled {
		a.mu.Unlock()
		return nil
	}
	a.settled = true
	taken := a.taken
	a.mu.Unlock()
	a.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := a.conn.Write(encodeText(msgAbort, 0, reason))
	for _, l := range taken {
		l.Close()
	}
	a.finish()
	return err
}

// finish closes the control connection and the offered fds not taken.
func (a *Acquired) finish() {
	a.conn.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, fd := range a.fds {
		closeFDs([]int{fd})
		delete(a.fds, name)
	}
}

package handoff

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/uds"
)

// Listener is a named listener that can be handed off: serve on it like on
// any net.Listener. When a successor commits, its Accept stops taking
// connections (they stay in the shared kernel backlog for the successor) and
// blocks until Close, which then leaves the socket file in place.
//
// States: serving -> released (a successor committed: Accept parks) ->
// closed. Invariant: once released is set, no call enters the inner Accept
// again, so every connection the kernel queued after that point is the
// successor's.
type Listener struct {
	*uds.Listener
	name string

	released  atomic.Bool
	entered   chan struct{} // closed on the first Accept call
	parked    chan struct{} // closed when an Accept parks after release
	closed    chan struct{}
	enterOnce sync.Once
	parkOnce  sync.Once
	closeOnce sync.Once
}

// Listen listens on address like uds.Listen and names the listener for a
// handoff. Names are unique within one process's offer.
func Listen(ctx context.Context, name, address string, opts uds.ListenOptions) (*Listener, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	l, err := uds.Listen(ctx, address, opts)
	if err != nil {
		return nil, err
	}
	return Wrap(name, l), nil
}

// Wrap names l for a handoff.
func Wrap(name string, l *uds.Listener) *Listener {
	return &Listener{Listener: l, name: name, entered: make(chan struct{}),
		parked: make(chan struct{}), closed: make(chan struct{})}
}

// Name is the listener's name in offers.
func (l *Listener) Name() string { return l.name }

// Accept returns the next connection, like uds.Listener.Accept, until the
// listener is released to a successor; then it waits for Close and returns
// net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	l.enterOnce.Do(func() { close(l.entered) })
	if l.released.Load() {
		return nil, l.park()
	}
	c, err := l.Listener.Accept()
	if err != nil && l.released.Load() {
		return nil, l.park() // woken by release's deadline
	}
	// A connection accepted before the release took effect is ours to serve.
	return c, err
}

func (l *Listener) park() error {
	l.parkOnce.Do(func() { close(l.parked) })
	<-l.closed
	return net.ErrClosed
}

// Accepting is closed once Accept has been called: the process serves on
// the listener.
func (l *Listener) Accepting() <-chan struct{} { return l.entered }

// release stops taking connections: pending and later Accept calls park. It
// returns once the serving loop is back in Accept (so that a connection it
// took just before has been handed to the server) or after grace, and marks
// the socket file as no longer ours.
func (l *Listener) release(grace time.Duration) {
	l.released.Store(true)
	l.Listener.SetDeadline(time.Unix(1, 0)) // wake a pending Accept; accepts nothing
	l.Listener.Release()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-l.parked:
	case <-l.closed:
	case <-t.C:
	}
}

// Close closes the listener; a parked Accept returns net.ErrClosed. After a
// release the socket file stays: the successor serves it.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

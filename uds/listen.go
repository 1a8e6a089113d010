package uds

import (
	"context"
	"log/slog"
	"net"
	"os"
	"time"
)

// ListenOptions configures Listen. The zero value is the secure default.
type ListenOptions struct {
	// Mode is the socket file's permission bits. Default 0600 (owner only).
	Mode os.FileMode
	// UID and GID, when set (non-nil), chown the socket before it becomes reachable.
	UID, GID *int
	// DirMode is used for missing parent directories, which are created. Default 0700.
	DirMode os.FileMode
	// NoMkdir turns off creating missing parent directories.
	NoMkdir bool
	// Policy, when non-nil, is applied to each accepted unix peer before the
	// conn is returned from Accept; refused peers are closed, logged and counted.
	// Setting it on a TCP address is an error.
	Policy Policy
	// ProbeTimeout bounds the connect used to tell a stale socket from a live one. Default 200ms.
	ProbeTimeout time.Duration
	// Logger receives refusals and cleanup notes. Default slog.Default().
	Logger *slog.Logger
}

// Listener is a net.Listener whose Accept returns *Conn.
type Listener struct {
	net.Listener
	addr Addr
	opts ListenOptions
}

// Listen listens on address (see ParseAddr) with socket hygiene.
func Listen(ctx context.Context, address string, opts ListenOptions) (*Listener, error) {
	a, err := ParseAddr(address)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, a.Network(), a.SockaddrName())
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: l, addr: a, opts: opts}, nil
}

// Addr returns the address the listener was asked to listen on.
func (l *Listener) UAddr() Addr { return l.addr }

// Accept waits for the next permitted connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	uc := &Conn{Conn: c}
	if l.addr.IsUnix() {
		if cr, err := PeerCred(c); err == nil {
			uc.cred, uc.hasCred = cr, true
		}
	}
	return uc, nil
}

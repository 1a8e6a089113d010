package uds

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
)

// Cred is what the kernel says about the process at the other end of a unix
// socket, as of connect(2)/listen(2). PID is an observation, not an identity:
// pids are reused, so never authorize on PID alone.
type Cred struct {
	PID int32
	UID uint32
	GID uint32
}

func (c Cred) String() string { return fmt.Sprintf("pid=%d uid=%d gid=%d", c.PID, c.UID, c.GID) }

// ErrNoCred is returned by PeerCred for connections that carry no kernel
// credentials (TCP, or a conn that is not a socket).
var ErrNoCred = errors.New("no peer credentials: not a unix socket connection")

// Policy decides whether a peer may talk to a listener. It returns nil to allow
// and an error (the reason, which is logged) to refuse.
type Policy func(Cred) error

// ErrPeerRefused is wrapped by every refusal from the helpers below.
var ErrPeerRefused = errors.New("peer refused by policy")

// AllowUIDs allows peers whose uid is one of uids.
func AllowUIDs(uids ...uint32) Policy {
	return func(c Cred) error {
		if slices.Contains(uids, c.UID) {
			return nil
		}
		return fmt.Errorf("%w: uid %d not in %v", ErrPeerRefused, c.UID, uids)
	}
}

// AllowGIDs allows peers whose primary gid is one of gids.
func AllowGIDs(gids ...uint32) Policy {
	return func(c Cred) error {
		if slices.Contains(gids, c.GID) {
			return nil
		}
		return fmt.Errorf("%w: gid %d not in %v", ErrPeerRefused, c.GID, gids)
	}
}

// AllowSameUser allows peers running as this process's effective uid.
func AllowSameUser() Policy { return AllowUIDs(uint32(os.Geteuid())) }

// AllowRoot allows peers running as uid 0.
func AllowRoot() Policy { return AllowUIDs(0) }

// AnyOf allows a peer that at least one of ps allows.
func AnyOf(ps ...Policy) Policy {
	return func(c Cred) error {
		var errs []error
		for _, p := range ps {
			err := p(c)
			if err == nil {
				return nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return fmt.Errorf("%w: empty AnyOf", ErrPeerRefused)
		}
		return errors.Join(errs...)
	}
}

// AllOf allows a peer that every one of ps allows.
func AllOf(ps ...Policy) Policy {
	return func(c Cred) error {
		for _, p := range ps {
			if err := p(c); err != nil {
				return err
			}
		}
		return nil
	}
}

// Conn is a connection accepted by a Listener. It carries the peer's kernel
// credentials (unix sockets only) and forwards CloseWrite and SyscallConn to the
// underlying socket so half-close and splice keep working.
type Conn struct {
	net.Conn
	cred    Cred
	hasCred bool
	remote  *RemoteID
}

// Cred returns the peer's credentials and whether there are any (false for TCP and TLS).
func (c *Conn) Cred() (Cred, bool) { return c.cred, c.hasCred }

// Peer returns who the peer is: kernel credentials (unix sockets) or the
// verified certificate identity (tls:).
func (c *Conn) Peer() Peer { return Peer{Cred: c.cred, HasCred: c.hasCred, Remote: c.remote} }

// NetConn returns the underlying *net.UnixConn, *net.TCPConn or, on a tls:
// listener, *tls.Conn.
func (c *Conn) NetConn() net.Conn { return c.Conn }

type closeWriter interface{ CloseWrite() error }
type closeReader interface{ CloseRead() error }

// CloseWrite shuts down the writing side (half-close) of the underlying socket.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// CloseRead shuts down the reading side of the underlying socket.
func (c *Conn) CloseRead() error {
	if cr, ok := c.Conn.(closeReader); ok {
		return cr.CloseRead()
	}
	return errors.ErrUnsupported
}

// SyscallConn gives access to the underlying socket's file descriptor.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// ReadFrom lets io.Copy use the underlying socket's fast paths (splice, sendfile).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

// WriteTo lets io.Copy use the underlying socket's fast paths (splice).
func (c *Conn) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, c.Conn) }

// CredOf returns the credentials attached to a conn accepted by a Listener, or
// asks the kernel for any other unix socket conn.
func CredOf(c net.Conn) (Cred, bool) {
	if uc, ok := c.(*Conn); ok {
		return uc.Cred()
	}
	cr, err := PeerCred(c)
	return cr, err == nil
}

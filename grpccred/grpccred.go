package grpccred

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/udskit/udskit/uds"
)

// SecurityProtocol is what Info reports, and AuthInfo.AuthType.
const SecurityProtocol = "udskit-peercred"

// AuthInfo is the credentials.AuthInfo of a connection made with these
// credentials: the kernel's word on the process at the other end, as of
// connect(2). PID is an observation, not an identity (pids are reused):
// authorize on UID/GID.
type AuthInfo struct {
	credentials.CommonAuthInfo
	Cred uds.Cred
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return SecurityProtocol }

// FromContext returns the caller's credentials in a gRPC handler (server
// side) or the server's after a call (client side, with grpc.Peer). ok is
// false when the connection was not made with this package's credentials.
func FromContext(ctx context.Context) (uds.Cred, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return uds.Cred{}, false
	}
	switch ai := p.AuthInfo.(type) {
	case AuthInfo:
		return ai.Cred, true
	case *AuthInfo:
		return ai.Cred, ai != nil
	}
	return uds.Cred{}, false
}

// ErrNotUnix is the handshake error for a connection that is not a unix
// socket (TCP): it carries no kernel credentials.
var ErrNotUnix = errors.New("grpccred: not a unix socket connection: TCP peers carry no kernel credentials")

// ServerOptions configures NewServer. The zero value admits every local
// peer whose credentials the kernel reports, and refuses TCP; the socket's
// mode (uds.Listen: owner-only by default) says who can connect at all.
type ServerOptions struct {
	// Policy decides which peers may connect (uds.AllowUIDs(...),
	// uds.AllowSameUser(), ...). nil: any peer with kernel credentials.
	Policy uds.Policy
	// Logger receives refusals at Warn level, at most one line a second
	// (the next line says how many were not logged). Default slog.Default().
	Logger *slog.Logger
}

// ServerCreds is the server side's credentials.TransportCredentials.
type ServerCreds struct {
	opts    ServerOptions
	refused *atomic.Uint64
	lim     *logLimiter
}

// NewServer returns transport credentials for a grpc.Server
// (grpc.Creds(creds)) that runs opts.Policy on each connection's kernel
// credentials at the handshake.
func NewServer(opts ServerOptions) *ServerCreds {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &ServerCreds{opts: opts, refused: new(atomic.Uint64), lim: &logLimiter{}}
}

// Refused returns how many connections the handshake refused (the policy,
// or no credentials).
func (c *ServerCreds) Refused() uint64 { return c.refused.Load() }

// ServerHandshake reads the peer's credentials and runs the policy. A
// refused peer's connection is closed by grpc-go before any byte of it is
// read.
func (c *ServerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cred, ok := uds.CredOf(raw)
	var reason error
	switch {
	case !ok:
		reason = fmt.Errorf("%w: %w", uds.ErrPeerRefused, ErrNotUnix)
	case c.opts.Policy != nil:
		reason = c.opts.Policy(cred)
	}
	if reason != nil {
		c.refused.Add(1)
		if ok, n := c.lim.allow(); ok {
			c.opts.Logger.Warn("grpccred: peer refused at the handshake", "pid", cred.PID, "uid", cred.UID, "gid", cred.GID,
				"reason", reason.Error(), "suppressed", n)
		}
		return nil, nil, fmt.Errorf("grpccred: %w", reason)
	}
	return raw, authInfo(cred), nil
}

// ClientHandshake is not for a server's credentials: use NewClient.
func (c *ServerCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("grpccred: server credentials used to dial; use grpccred.NewClient")
}

// Info implements credentials.TransportCredentials.
func (c *ServerCreds) Info() credentials.ProtocolInfo { return info() }

// Clone returns credentials sharing the options and the refusal count.
func (c *ServerCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName is a no-op (no names are checked over a unix socket).
func (c *ServerCreds) OverrideServerName(string) error { return nil }

// ClientOptions configures NewClient. The zero value accepts any server
// process the kernel reports credentials for.
type ClientOptions struct {
	// Policy, when set, checks the server process's credentials before the
	// first RPC (e.g. uds.AllowRoot(): only a server running as root).
	Policy uds.Policy
}

// ClientCreds is the client side's credentials.TransportCredentials.
type ClientCreds struct{ opts ClientOptions }

// NewClient returns transport credentials for grpc.NewClient
// (grpc.WithTransportCredentials(creds)) on a unix socket target
// ("unix:///run/app/grpc.sock").
func NewClient(opts ClientOptions) *ClientCreds { return &ClientCreds{opts: opts} }

// ClientHandshake reads the server process's credentials and runs the
// client's policy on them.
func (c *ClientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cred, ok := uds.CredOf(raw)
	if !ok {
		return nil, nil, ErrNotUnix
	}
	if c.opts.Policy != nil {
		if err := c.opts.Policy(cred); err != nil {
			return nil, nil, fmt.Errorf("grpccred: the server process (%s) is refused by the client's policy: %w", cred, err)
		}
	}
	return raw, authInfo(cred), nil
}

// ServerHandshake is not for a client's credentials: use NewServer.
func (c *ClientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("grpccred: client credentials used to serve; use grpccred.NewServer")
}

// Info implements credentials.TransportCredentials.
func (c *ClientCreds) Info() credentials.ProtocolInfo { return info() }

// Clone implements credentials.TransportCredentials.
func (c *ClientCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName is a no-op.
func (c *ClientCreds) OverrideServerName(string) error { return nil }

func info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: SecurityProtocol}
}

// authInfo: a unix socket stays on this machine and the kernel vouches for
// the peer, the same level grpc-go's own local credentials give one
// (PrivacyAndIntegrity), so per-RPC credentials that require a secure
// transport work over it.
func authInfo(cred uds.Cred) AuthInfo {
	return AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, Cred: cred}
}

// logLimiter allows one log line a second and counts the rest.
type logLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed uint64
}

func (l *logLimiter) allow() (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < time.Second {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}

package demo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// ServerOptions configure Server. Zero values are the documented defaults.
type ServerOptions struct {
	// Listen is passed to uds.Listen: Mode (default 0600, owner only), Policy
	// (e.g. uds.AllowUIDs), and the rest.
	Listen uds.ListenOptions
	// MaxConns caps open connections; more are accepted and closed at once. 0: no limit.
	MaxConns int
	// RPC configures the rpc.Server (timeouts, memory budget, ...); its
	// Logger defaults to Logger.
	RPC rpc.ServerOptions
	// Methods bounds the demo methods.
	Methods Options
	// Logger receives connect/disconnect lines with peer credentials. Default slog.Default().
	Logger *slog.Logger
}

// Server is the demo service on one listener: uds.Server for the accept loop
// and connection limit, rpc.Server for the calls.
type Server struct {
	RPC  *rpc.Server
	opts ServerOptions
	log  *slog.Logger
	conn *uds.Server
	ln   Listener
}

// Listener is what a Server serves on: a *uds.Listener, or one that wraps
// it (a handoff.Listener).
type Listener interface {
	net.Listener
	UAddr() uds.Addr
}

// Listen opens address and returns a Server ready to Serve.
func Listen(ctx context.Context, address string, opts ServerOptions) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Listen.Logger == nil {
		opts.Listen.Logger = log
	}
	ln, err := uds.Listen(ctx, address, opts.Listen)
	if err != nil {
		return nil, err
	}
	return New(ln, opts), nil
}

// New returns a Server ready to Serve on ln (already listening: inherited,
// or taken over from another process). opts.Listen is not used.
func New(ln Listener, opts ServerOptions) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{opts: opts, log: log, ln: ln}
	if opts.RPC.Logger == nil {
		opts.RPC.Logger = log
	}
	s.RPC = rpc.NewServer(opts.RPC)
	Register(s.RPC, opts.Methods)
	s.conn = &uds.Server{MaxConns: opts.MaxConns, Logger: log, Handler: s.handle}
	if ul, ok := ln.(interface {
		SetRefusalNotice(func(uds.Cred, error) []byte)
	}); ok { // a *uds.Listener, or one that embeds it
		ul.SetRefusalNotice(rpc.RefusalNotice) // spec 5.4: a refused client learns it is permanent
	}
	return s
}

// Addr is the listening address in udskit syntax (tcp with the real port).
func (s *Server) Addr() string {
	a := s.ln.UAddr()
	if a.Kind == uds.TCP {
		return "tcp:" + s.ln.Addr().String()
	}
	return a.String()
}

func (s *Server) handle(_ context.Context, c net.Conn) {
	start := time.Now()
	attrs := []any{"remote", c.RemoteAddr().String()}
	if cr, ok := uds.CredOf(c); ok {
		attrs = []any{"pid", cr.PID, "uid", cr.UID, "gid", cr.GID}
	} else if r := uds.PeerOf(c).Remote; r != nil {
		attrs = append(attrs, "peer", uds.Peer{Remote: r}.String())
	}
	s.log.Info("connect", attrs...)
	s.RPC.ServeConn(c)
	s.log.Info("disconnect", append(attrs, "after", time.Since(start).Round(time.Millisecond).String())...)
}

// Serve serves until Shutdown or Close; it returns nil after them.
func (s *Server) Serve() error {
	err := s.conn.Serve(s.ln)
	if errors.Is(err, uds.ErrServerClosed) {
		return nil
	}
	return err
}

// ActiveConns is the number of open connections.
func (s *Server) ActiveConns() int { return s.conn.ActiveConns() }

// Rejected counts the connections closed at once because MaxConns were open.
func (s *Server) Rejected() uint64 { return s.conn.Rejected() }

// Shutdown drains: stop accepting (the socket file is removed), tell udskit
// clients to go away, let in-flight calls finish and their answers go out, and
// return when every connection is gone. When ctx ends first it closes what is
// left and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.conn.Shutdown(ctx) }()
	err := s.RPC.Shutdown(ctx)
	if e := <-errc; err == nil {
		err = e
	}
	return err
}

// Linger keeps serving (accepting, no goaway) until no connection is open
// and minGrace has passed, or ctx ends; the health method says "draining"
// meanwhile (rpc.Server.Linger). Shutdown afterwards stops the server.
func (s *Server) Linger(ctx context.Context, minGrace time.Duration) error {
	return s.RPC.Linger(ctx, minGrace)
}

// Close stops at once: connections are closed and in-flight calls canceled.
func (s *Server) Close() error {
	s.RPC.Close()
	return s.conn.Close()
}

// DefaultAddress is where `udskit serve` listens without an address, and
// where `udskit call` calls without one (DefaultCallAddress):
// $XDG_RUNTIME_DIR/udskit.sock when that directory exists and is private,
// else udskit.sock in $TMPDIR/udskit-UID, a private (0700) directory of this
// user's that DefaultAddress creates (like tmux's /tmp/tmux-UID). A directory
// of that name that is not a private directory of ours is refused: another
// user could have put it there to catch our clients. cleanup removes that
// directory if it is empty (a no-op for $XDG_RUNTIME_DIR).
func DefaultAddress() (addr string, cleanup func(), err error) {
	if d, ok := runtimeDir(); ok {
		return "unix:" + filepath.Join(d, "udskit.sock"), func() {}, nil
	}
	dir := fallbackDir()
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", nil, fmt.Errorf("make a private dir for the socket: %w", err)
	}
	if err := checkPrivateDir(dir); err != nil {
		return "", nil, err
	}
	return "unix:" + filepath.Join(dir, "udskit.sock"), func() { os.Remove(dir) }, nil
}

// DefaultCallAddress is DefaultAddress for a client: it creates nothing, and
// refuses a fallback directory that is not a private directory of ours.
func DefaultCallAddress() (string, error) {
	if d, ok := runtimeDir(); ok {
		return "unix:" + filepath.Join(d, "udskit.sock"), nil
	}
	dir := fallbackDir()
	if err := checkPrivateDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return "unix:" + filepath.Join(dir, "udskit.sock"), nil
}

func runtimeDir() (string, bool) {
	d := os.Getenv("XDG_RUNTIME_DIR")
	if d == "" {
		return "", false
	}
	st, err := os.Stat(d)
	return d, err == nil && st.IsDir() && st.Mode().Perm()&0o077 == 0
}

func fallbackDir() string {
	return filepath.Join(os.TempDir(), "udskit-"+strconv.Itoa(os.Geteuid()))
}

// checkPrivateDir accepts dir only if it is a real directory (not a symlink)
// owned by this user with no permissions for anyone else.
func checkPrivateDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return fmt.Errorf("%s is not a private (0700) directory of yours, so it cannot hold the default socket: "+
			"remove it if it is yours, or give an address (e.g. udskit serve ./demo.sock)", dir)
	}
	return nil
}

func ownedByMe(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

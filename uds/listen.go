package uds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenOptions configures Listen. The zero value is the secure default.
//
// Mode, UID, GID, DirMode and NoMkdir concern the socket file and are ignored
// for abstract names and TCP addresses (there is no file). Policy works on any
// unix socket (path or abstract) and is refused on TCP (ErrPolicyOnTCP).
type ListenOptions struct {
	// Mode is the socket file's permission bits. Default 0600 (owner only).
	// Connecting needs write permission on the socket.
	Mode os.FileMode
	// UID and GID, when non-nil, chown the socket before it accepts anyone.
	UID, GID *int
	// DirMode is used for missing parent directories, which are created.
	// Default 0700. Existing directories are left as they are.
	DirMode os.FileMode
	// NoMkdir turns off creating missing parent directories.
	NoMkdir bool
	// Policy, when non-nil, is applied to each accepted unix peer before the
	// conn is returned from Accept; refused peers are closed before a byte is
	// read, logged and counted (Listener.Refused).
	Policy Policy
	// ProbeTimeout bounds the connect used to tell a stale socket from a live
	// one. Default 200ms.
	ProbeTimeout time.Duration
	// Logger receives refusals and cleanup notes. Default slog.Default().
	Logger *slog.Logger

	// PeerPolicy, when non-nil, decides on every peer, local or remote (see
	// PeerPolicy): on unix sockets after Policy, on tls: inside the
	// handshake, where it makes client certificates required and verified
	// (mutual TLS). A plain tcp: address has no identity to check: a
	// PeerPolicy there is ErrPolicyOnTCP.
	PeerPolicy PeerPolicy
	// TLS is the server configuration of a tls: address (required there,
	// ignored elsewhere): certificates, and ClientCAs for client
	// certificates. MinVersion defaults to TLS 1.3. See package tlsfiles for
	// PEM files reloaded on change.
	TLS *tls.Config
	// TLSHandshakeTimeout bounds each client's TLS handshake. Default
	// DefaultTLSHandshakeTimeout.
	TLSHandshakeTimeout time.Duration
}

func (o *ListenOptions) mode() uint32 {
	if o.Mode == 0 {
		return 0o600
	}
	return uint32(o.Mode.Perm())
}

func (o *ListenOptions) dirMode() os.FileMode {
	if o.DirMode == 0 {
		return 0o700
	}
	return o.DirMode.Perm()
}

func (o *ListenOptions) probeTimeout() time.Duration {
	if o.ProbeTimeout <= 0 {
		return 200 * time.Millisecond
	}
	return o.ProbeTimeout
}

func (o *ListenOptions) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Listener is a net.Listener whose Accept returns *Conn, applies the Policy,
// and whose Close removes the socket file only while it is still its own.
type Listener struct {
	net.Listener
	addr       Addr
	policy     Policy
	peerPolicy PeerPolicy
	log        *slog.Logger
	refused    atomic.Uint64
	// refusedLog rate-limits the refusal lines: a flood of refused peers
	// writes one line a second, with the count of those not logged.
	refusedLog rateLog
	// notice, when set (SetRefusalNotice), makes the bytes a refused peer is
	// told before its connection closes; notices counts refusals in progress.
	notice  atomic.Pointer[func(Cred, error) []byte]
	notices atomic.Int32

	// Path sockets only.
	path      string
	sockID    fileID      // identity (dev, inode, ctime) of the socket file we bound
	keepFile  atomic.Bool // Close leaves the socket file: inherited, or released to another process
	closeOnce sync.Once
	closeErr  error
}

// Listen listens on address (see ParseAddr) with socket hygiene:
//
//   - A unix path is checked against the OS length limit before any system
//     call (*PathTooLongError). Missing parent directories are created with
//     DirMode unless NoMkdir.
//   - Under an advisory flock on PATH.lock, held across probe, unlink and bind:
//     a non-socket at the path is never removed (*NotSocketError); a socket is
//     probed with a short connect: a live answer is *InUseError (with the
//     server's pid where the OS tells it), ECONNREFUSED means stale, and the
//     stale socket is removed.
//   - The socket is bound, given Mode (default 0600) and UID/GID, and only then
//     put into the listening state, so it is never reachable with looser
//     permissions. On Linux the file is even created with Mode (fchmod before
//     bind), whatever the umask.
//   - Abstract names (@name) are never unlinked; a name in use is *InUseError.
//   - TCP addresses listen plainly; a Policy on TCP is ErrPolicyOnTCP.
func Listen(ctx context.Context, address string, opts ListenOptions) (*Listener, error) {
	a, err := ParseAddr(address)
	if err != nil {
		return nil, err
	}
	var l *Listener
	switch a.Kind {
	case TCP:
		l, err = listenTCP(ctx, a, &opts)
	case Abstract:
		l, err = listenAbstract(ctx, a, &opts)
	case Passed:
		l, err = listenPassed(a, &opts)
	case TLS:
		l, err = listenTLS(ctx, a, &opts)
	case SSH:
		return nil, &AddrError{Input: address, Name: "dial_only", Reason: "an ssh:// address can be dialed, not listened on: serve on the remote host's unix socket and dial ssh://HOST/PATH"}
	default:
		l, err = listenPath(ctx, a, &opts)
	}
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", a, err)
	}
	l.policy = opts.Policy
	l.peerPolicy = opts.PeerPolicy
	l.log = opts.logger()
	return l, nil
}

func listenTLS(ctx context.Context, a Addr, opts *ListenOptions) (*Listener, error) {
	if opts.Policy != nil {
		return nil, fmt.Errorf("%w; on tls: use ListenOptions.PeerPolicy (Policy.Local() turns a uid/gid rule into one)", ErrPolicyOnTCP)
	}
	conf, err := serverTLSConfig(opts.TLS, opts.PeerPolicy)
	if err != nil {
		return nil, err
	}
	plain := *opts
	plain.PeerPolicy = nil
	l, err := listenTCP(ctx, Addr{Kind: TCP, Name: a.Name}, &plain)
	if err != nil {
		return nil, err
	}
	l.addr.Kind = TLS
	l.Listener = newTLSListener(l.Listener, conf, opts.TLSHandshakeTimeout, l.tlsRefused)
	return l, nil
}

// tlsRefused logs and counts a client whose TLS handshake failed or whose
// certificate the PeerPolicy refused.
func (l *Listener) tlsRefused(raw net.Conn, err error) {
	if ok, n := l.refusedLog.allow(); ok && l.log != nil {
		l.log.Warn("uds: TLS peer refused", "addr", l.addr.String(), "remote", raw.RemoteAddr().String(),
			"reason", err.Error(), "suppressed", n)
	}
	l.refused.Add(1)
}

func listenTCP(ctx context.Context, a Addr, opts *ListenOptions) (*Listener, error) {
	if opts.Policy != nil || opts.PeerPolicy != nil {
		return nil, fmt.Errorf("%w (for remote peers with an identity use tls:HOST:PORT)", ErrPolicyOnTCP)
	}
	var lc net.ListenConfig
	nl, err := lc.Listen(ctx, "tcp", a.Name)
	if err != nil {
		// Listen names the address already: keep the system call's error
		// ("bind: address already in use"), not net's "listen tcp ADDR: ...".
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err
		}
		return nil, err
	}
	// Report the real port when asked for port 0.
	a.Name = nl.Addr().String()
	return &Listener{Listener: nl, addr: a}, nil
}

func listenAbstract(ctx context.Context, a Addr, opts *ListenOptions) (*Listener, error) {
	if err := checkSunPath(a); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	nl, err := lc.Listen(ctx, "unix", a.SockaddrName())
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			_, pid, _ := probe(ctx, a.SockaddrName(), opts.probeTimeout())
			return nil, &InUseError{Path: a.SockaddrName(), PID: pid}
		}
		return nil, err
	}
	return &Listener{Listener: nl, addr: a}, nil
}

// checkSunPath returns a *PathTooLongError when a does not fit in sun_path.
func checkSunPath(a Addr) error {
	switch a.Kind {
	case Unix:
		if len(a.Name)+1 > sunPathMax {
			return &PathTooLongError{Path: a.Name, Len: len(a.Name), Max: sunPathMax}
		}
	case Abstract:
		// A leading NUL and the name, no terminator.
		if n := len(a.Name) + 1; n > sunPathMax {
			return &PathTooLongError{Path: "@" + a.Name, Len: n, Max: sunPathMax}
		}
	}
	return nil
}

func listenPath(ctx context.Context, a Addr, opts *ListenOptions) (*Listener, error) {
	path := a.Name
	if err := checkSunPath(a); err != nil {
		return nil, err
	}
	if !opts.NoMkdir {
		if err := mkdirAll(filepath.Dir(path), opts.dirMode()); err != nil {
			return nil, err
		}
	}
	// The lock is held only across probe+unlink+bind, so a long wait means a
	// stuck process: give up rather than hang forever.
	lctx, cancel := context.WithTimeout(ctx, max(5*time.Second, 10*opts.probeTimeout()))
	defer cancel()
	lock, err := lockFile(lctx, path+".lock")
	if err != nil {
		return nil, err
	}
	defer lock.Close() // releases the flock; the file stays until Close

	if err := clearStale(ctx, path, opts.probeTimeout(), opts.logger()); err != nil {
		removeLockUnlessSocket(path)
		return nil, err
	}
	fd, id, err := bindSocket(path, opts)
	if err != nil {
		removeLockUnlessSocket(path)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	nl, err := net.FileListener(f)
	f.Close()
	if err != nil {
		unlinkIfSame(path, id)
		return nil, err
	}
	return &Listener{Listener: nl, addr: a, path: path, sockID: id}, nil
}

// bindSocket creates, binds, chmods, chowns and finally listens on a unix
// socket at path, in that order, so that nobody can connect before the
// permissions are final. It returns the fd and the socket file's identity.
func bindSocket(path string, opts *ListenOptions) (fd int, id fileID, err error) {
	fd, err = newUnixSocket()
	if err != nil {
		return -1, id, os.NewSyscallError("socket", err)
	}
	var info os.FileInfo
	defer func() {
		if err != nil {
			unix.Close(fd)
			if info != nil {
				unlinkIfSame(path, fileIDOf(info))
			}
		}
	}()
	mode := opts.mode()
	if err = presetSocketMode(fd, mode); err != nil {
		return -1, id, os.NewSyscallError("fchmod", err)
	}
	if err = unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			// Something appeared at the path after our check, from a
			// process that does not take our lock. Never replace it.
			return -1, id, fmt.Errorf("%s appeared while binding (another process not using %s.lock?): %w", path, path, os.NewSyscallError("bind", err))
		}
		return -1, id, os.NewSyscallError("bind", err)
	}
	uid, gid := -1, -1
	if opts.UID != nil {
		uid = *opts.UID
	}
	if opts.GID != nil {
		gid = *opts.GID
	}
	// The umask may have narrowed the mode the file was created with, and
	// the owner is to be set. Neither may follow a symlink: whoever can write
	// in the directory can swap one in right after bind (see
	// setSocketFileAttrs).
	if info, err = setSocketFileAttrs(path, mode, uid, gid); err != nil {
		return -1, id, err
	}
	if err = unix.Listen(fd, 4096); err != nil { // the kernel caps it at somaxconn
		return -1, id, os.NewSyscallError("listen", err)
	}
	return fd, fileIDOf(info), nil
}

// clearStale makes path free for bind: nothing there, or a stale socket that
// it removes. The caller holds the path's lock.
func clearStale(ctx context.Context, path string, timeout time.Duration, log *slog.Logger) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%w; refusing to remove it", &NotSocketError{Path: path, What: describeMode(fi.Mode())})
	}
	live, pid, err := probe(ctx, path, timeout)
	if live {
		return &InUseError{Path: path, PID: pid}
	}
	if err != nil {
		return fmt.Errorf("cannot tell whether the socket at %s is live, leaving it: %w", path, err)
	}
	// Stale. Remove it only if it is still the very file we probed.
	now, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if !os.SameFile(fi, now) {
		return fmt.Errorf("%s changed while probing it (another process not using %s.lock?); leaving it", path, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	log.Info("uds: removed stale socket", "path", path)
	return nil
}

// probe connects to a unix socket (path or "@name") to tell a live server
// from a stale file. live is true when a server answered or its backlog is
// full; err is set when the answer is neither live nor ECONNREFUSED.
func probe(ctx context.Context, name string, timeout time.Duration) (live bool, pid int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", name)
	if err == nil {
		cr, _ := PeerCred(c)
		c.Close()
		return true, ownerPID(name, cr.PID), nil
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return false, 0, nil
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, context.DeadlineExceeded):
		// Backlog full or too slow to answer: someone is listening.
		return true, ownerPID(name, 0), nil
	case errors.Is(err, fs.ErrNotExist):
		return false, 0, nil
	}
	return false, 0, err
}

// describeMode names a file type for NotSocketError.
func describeMode(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "regular file"
	case fs.ModeDir:
		return "directory"
	case fs.ModeSymlink:
		return "symbolic link"
	case fs.ModeNamedPipe:
		return "named pipe (FIFO)"
	case fs.ModeDevice:
		return "block device"
	case fs.ModeDevice | fs.ModeCharDevice:
		return "character device"
	}
	return "file of type " + m.Type().String()
}

// mkdirAll creates dir and any missing parents with exactly mode (chmod after
// mkdir, so the umask does not change it). Existing directories are untouched.
func mkdirAll(dir string, mode os.FileMode) error {
	if dir == "" || dir == "." {
		return nil
	}
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is a %s, not a directory", dir, describeMode(fi.Mode()))
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	return os.Chmod(dir, mode)
}

// openLockFile opens (creating 0600) the lock file name, which must be a
// regular file owned by us. O_NOFOLLOW: a symlink there is refused, never
// followed; O_NONBLOCK: a FIFO there cannot hang the open (it is then
// refused like any other non-regular file).
func openLockFile(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		if fi, lerr := os.Lstat(name); lerr == nil && !fi.Mode().IsRegular() {
			return nil, badLockFile(name, describeMode(fi.Mode()))
		}
		return nil, fmt.Errorf("lock file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, badLockFile(name, describeMode(fi.Mode()))
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		f.Close()
		return nil, badLockFile(name, fmt.Sprintf("file owned by uid %d (we are uid %d)", uid, os.Geteuid()))
	}
	return f, nil
}

func badLockFile(name, what string) error {
	return fmt.Errorf("lock file %s is a %s, not a regular file of ours: someone else put it there; remove it (after checking who) and retry", name, what)
}

// lockFile opens (creating 0600) and exclusively flocks name, polling until
// ctx ends. It retries when the file it locked was unlinked meanwhile (a
// Close removing it), so the lock is always on the file now at name.
func lockFile(ctx context.Context, name string) (*os.File, error) {
	delay := time.Millisecond
	for {
		f, err := openLockFile(name)
		if err != nil {
			return nil, err
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) {
				break
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("waiting for lock %s: %w", name, ctx.Err())
			case <-time.After(delay):
			}
			delay = min(delay*2, 50*time.Millisecond)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, os.NewSyscallError("flock", err))
		}
		held, err1 := f.Stat()
		now, err2 := os.Lstat(name)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close() // the file was replaced while we waited: lock the new one
	}
}

// removeLockUnlessSocket removes PATH.lock after a failed Listen, unless a
// socket is at path (a live server's, whose Close removes it). The caller
// holds the lock: anyone waiting on it re-checks the inode and retries.
func removeLockUnlessSocket(path string) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		return
	}
	os.Remove(path + ".lock")
}

// fileID identifies a file more tightly than (dev, inode), which filesystems
// such as ext4 reuse as soon as a file is deleted: the ctime is added.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

// unlinkIfSame removes path only if it is still the file identified by id.
func unlinkIfSame(path string, id fileID) bool {
	now, err := os.Lstat(path)
	if err != nil || fileIDOf(now) != id {
		return false
	}
	return os.Remove(path) == nil
}

// UAddr returns the address the listener listens on (for TCP port 0, the port
// the kernel chose).
func (l *Listener) UAddr() Addr { return l.addr }

// Addr returns the listener's network address.
func (l *Listener) Addr() net.Addr {
	if l.path != "" {
		return &net.UnixAddr{Name: l.path, Net: "unix"}
	}
	return l.Listener.Addr()
}

// Refused returns how many peers the Policy has refused so far.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Accept waits for the next connection the Policy allows and returns it as a
// *Conn carrying the peer's credentials. A refused peer is closed before any
// byte is read from it, counted, and logged at Warn level (at most one line
// a second; each line says how many refusals it did not log, and Close logs
// the rest); Accept then waits for the next one.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc := &Conn{Conn: c}
		if tc, ok := c.(*tls.Conn); ok {
			// The handshake, and the PeerPolicy inside it, are done.
			uc.remote = PeerFromTLS(tc.ConnectionState())
			return uc, nil
		}
		if !l.addr.IsUnix() {
			return uc, nil
		}
		cr, credErr := PeerCred(c)
		if credErr == nil {
			uc.cred, uc.hasCred = cr, true
		}
		if l.policy == nil && l.peerPolicy == nil {
			return uc, nil
		}
		reason := credErr
		if credErr == nil {
			if l.policy != nil {
				reason = l.policy(cr)
			}
			if reason == nil && l.peerPolicy != nil {
				reason = l.peerPolicy(uc.Peer())
			}
		} else {
			reason = fmt.Errorf("%w: %w", ErrPeerRefused, credErr)
		}
		if reason == nil {
			return uc, nil
		}
		if ok, n := l.refusedLog.allow(); ok {
			l.log.Warn("uds: peer refused by policy", "addr", l.addr.String(),
				"pid", cr.PID, "uid", cr.UID, "gid", cr.GID, "reason", reason.Error(), "suppressed", n)
		}
		l.refused.Add(1) // after the log's count: Refused() == n means n are accounted for there
		// Closed last: a peer that sees its connection end finds the
		// refusal already counted and logged.
		l.refuse(c, cr, reason)
	}
}

// maxNotices bounds the refused connections being told why at once; past
// it, a refused peer's connection is just closed.
const maxNotices = 32

// SetRefusalNotice sets what a peer the Policy refuses is told: fn's bytes
// are written to it (nothing is read from the peer first: the decision is made
// on its kernel credentials alone), then the connection is closed. rpc.Server
// sets a udskit error frame (spec section 5.4) so a client knows the refusal is
// permanent. Without a notice the connection is closed at once.
func (l *Listener) SetRefusalNotice(fn func(cr Cred, reason error) []byte) {
	if fn == nil {
		l.notice.Store(nil)
		return
	}
	l.notice.Store(&fn)
}

// refuse closes a refused connection, after writing the notice if one is set.
// The write and the drain that follows run apart from Accept, bounded in
// count (maxNotices) and time (a 500ms deadline).
func (l *Listener) refuse(c net.Conn, cr Cred, reason error) {
	fn := l.notice.Load()
	if fn == nil || l.notices.Add(1) > maxNotices {
		if fn != nil {
			l.notices.Add(-1)
		}
		c.Close()
		return
	}
	msg := (*fn)(cr, reason)
	go func() {
		defer l.notices.Add(-1)
		defer c.Close()
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write(msg); err != nil {
			return
		}
		// Half-close, then read what the peer already sent (its hello) until it
		// closes: closing a unix socket with unread bytes can reset the
		// peer's connection before it reads the notice.
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		var buf [256]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				return
			}
		}
	}()
}

// Close stops listening. For a socket path it then removes the socket file,
// but only if the path still holds the socket this Listener bound (same
// inode): a socket another server has since bound there is left alone. The
// PATH.lock file is removed with it. A listener that was inherited (ListenFD,
// systemd:, fd:) and not Own'ed, or that was Released, leaves the file.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.closeErr = l.Listener.Close()
		if n := l.refusedLog.flush(); n > 0 && l.log != nil {
			l.log.Warn("uds: more policy refusals since the last line", "addr", l.addr.String(), "suppressed", n)
		}
		if l.path != "" && !l.keepFile.Load() {
			l.cleanup()
		}
	})
	return l.closeErr
}

func (l *Listener) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lock, err := lockFile(ctx, l.path+".lock")
	if err != nil {
		// Best effort without the lock: still only our own inode.
		unlinkIfSame(l.path, l.sockID)
		return
	}
	defer lock.Close()
	// Our listener is closed, so a live answer at the path is another server
	// (on the same inode number by reuse): leave it.
	if live, _, _ := probe(ctx, l.path, 100*time.Millisecond); !live {
		unlinkIfSame(l.path, l.sockID)
	}
	if _, err := os.Lstat(l.path); errors.Is(err, fs.ErrNotExist) {
		// Nobody else is bound there: the lock file is ours to remove. Anyone
		// waiting on it re-checks the inode after locking and retries.
		os.Remove(l.path + ".lock")
	}
}

// checkOwnSocketInfo checks that fi, taken at path without following
// symlinks right after bind, is a socket owned by our effective uid: what
// bind created, not something swapped in by whoever can write in the
// directory.
func checkOwnSocketInfo(fi os.FileInfo, path string) error {
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s was replaced by a %s right after bind (someone else can write in its directory); not touching it", path, describeMode(fi.Mode()))
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("%s was replaced by a socket of uid %d right after bind (someone else can write in its directory); not touching it", path, uid)
	}
	return nil
}

func fileOwner(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

package capture

import (
	"context"
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

	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/uds"
)

// Interposer relays and records a live socket path. Create it with
// Interpose, run it with Serve.
//
// States: interposed (the relay socket is at the path, the original aside)
// -> restored (the original is back at the path; the relay still accepts
// for Grace, then closes; open connections drain) -> done. mu guards
// restored and the counters' stop trigger; conns counts relay goroutines.
type Interposer struct {
	path, aside, tmp string
	opts             InterposeOptions
	log              *slog.Logger
	ln               *net.UnixListener
	relayIno         uint64
	origIno          uint64

	force    context.Context // canceled by Cut: end every relayed connection
	cut      context.CancelFunc
	stop     chan struct{} // closed when Count is reached
	stopOnce sync.Once

	mu       sync.Mutex
	restored bool
	serving  bool          // Serve was called (under mu)
	shutdown bool          // Shutdown was called (under mu)
	shut     chan struct{} // closed by Shutdown: Serve is to stop
	served   chan struct{} // closed when Serve returns
	stopping atomic.Bool   // the accept loop is to end (Serve is draining the backlog)

	conns                                    sync.WaitGroup
	accepted, active, ended, failed, refused atomic.Int64
}

// Interpose takes the socket at path over: see the package documentation.
// It refuses (a *RefusedError) abstract names, TCP addresses, datagram
// sockets, symlinks, a path with no live server, and a directory it cannot
// write. A leftover from an earlier capture that was killed is restored
// first (unless that capture is still running: ErrCaptureRunning).
func Interpose(ctx context.Context, path string, opts InterposeOptions) (*Interposer, error) {
	opts.defaults()
	if opts.Sink == nil {
		return nil, errors.New("capture: InterposeOptions.Sink is required")
	}
	a, err := uds.ParseAddr(path)
	if err != nil {
		return nil, err
	}
	switch a.Kind {
	case uds.Abstract:
		return nil, &RefusedError{Path: path, Reason: "an abstract socket name has no file to rename, so it cannot be interposed",
			Hint: "relay it under a new name and point the clients there: udskit proxy --listen /tmp/x.sock --to " + path + " --capture out.pcapng"}
	case uds.TCP:
		return nil, &RefusedError{Path: path, Reason: "a TCP address: use tcpdump -i lo for TCP"}
	}
	abs, err := filepath.Abs(a.Name)
	if err != nil {
		return nil, err
	}
	path = abs
	if len(path+AsideSuffix)+1 > 108 || len(path+TempSuffix)+1 > 108 {
		return nil, &RefusedError{Path: path, Reason: fmt.Sprintf("the path is too long to add %q and still fit a socket address (108 bytes)", AsideSuffix)}
	}
	if res, err := Restore(path); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	} else if res != "" {
		opts.Logger.Warn("capture: restored a leftover of an earlier capture", "path", path, "what", res)
	}
	fi, err := checkInterposable(ctx, path)
	if err != nil {
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	ip := &Interposer{path: path, aside: path + AsideSuffix, tmp: path + TempSuffix, opts: opts, log: opts.Logger,
		origIno: st.Ino, stop: make(chan struct{}), shut: make(chan struct{}), served: make(chan struct{})}
	ip.force, ip.cut = context.WithCancel(context.Background())
	state := &State{PID: os.Getpid(), Path: path, Started: time.Now(), OrigDev: uint64(st.Dev), OrigIno: st.Ino}
	if err := createState(path, state); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, &RefusedError{Path: path, Reason: "another capture is starting on this path (" + path + StateSuffix + " exists)", Err: ErrCaptureRunning,
				Hint: "if none is, remove that file or run udskit capture --restore " + path}
		}
		return nil, &RefusedError{Path: path, Reason: "cannot write the state file beside the socket", Err: err}
	}
	undo := func() { os.Remove(path + StateSuffix) }
	ln, relayIno, err := bindRelay(ip.tmp, fi)
	if err != nil {
		undo()
		return nil, err
	}
	ip.ln, ip.relayIno = ln, relayIno
	state.RelayIno, state.Interpose = relayIno, true
	undoRelay := func() {
		ln.Close()
		if same(ip.tmp, relayIno) {
			os.Remove(ip.tmp)
		}
		undo()
	}
	if err := writeState(path, state); err != nil {
		undoRelay()
		return nil, err
	}
	// The original stays reachable under the aside name (a hard link: the
	// same socket inode), then the relay replaces the path in one rename.
	if err := os.Link(path, ip.aside); err != nil {
		undoRelay()
		hint := ""
		if errors.Is(err, fs.ErrPermission) {
			hint = "fs.protected_hardlinks forbids linking a file you do not own: run as the socket's owner or root"
		}
		return nil, &RefusedError{Path: path, Reason: "cannot link the socket aside", Hint: hint, Err: err}
	}
	if !same(path, st.Ino) || !same(ip.aside, st.Ino) {
		os.Remove(ip.aside)
		undoRelay()
		return nil, &RefusedError{Path: path, Reason: "the socket was replaced while capture was starting (did the server restart?)", Hint: "try again"}
	}
	if err := os.Rename(ip.tmp, path); err != nil {
		if same(ip.aside, st.Ino) {
			os.Remove(ip.aside)
		}
		undoRelay()
		return nil, &RefusedError{Path: path, Reason: "cannot rename the relay socket over the path", Err: err}
	}
	ip.log.Info("capture: interposed", "path", path, "original_aside", ip.aside, "pid", os.Getpid())
	return ip, nil
}

// checkInterposable says why path cannot be interposed, or returns its Lstat.
func checkInterposable(ctx context.Context, path string) (fs.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, &RefusedError{Path: path, Reason: "no socket at this path", Err: err, Hint: "is the server running? udskit doctor " + path}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		return nil, &RefusedError{Path: path, Reason: "it is a symlink (to " + target + ")", Hint: "capture the socket it points to"}
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return nil, &RefusedError{Path: path, Reason: "not a socket (" + fi.Mode().Type().String() + ")"}
	}
	if err := probeStream(ctx, path); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return nil, &RefusedError{Path: path, Reason: "no write permission on " + dir, Err: err,
			Hint: "interposing renames the socket file in its directory: run as its owner or root, or use udskit proxy --listen NEW --to " + path + " --capture FILE"}
	}
	return fi, nil
}

// probeStream connects to path as a stream socket: a datagram (or
// seqpacket) socket, a refused connect and a permission error are refused.
func probeStream(ctx context.Context, path string) error {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "unix", path)
	switch {
	case err == nil:
		c.Close()
		return nil
	case errors.Is(err, syscall.EPROTOTYPE):
		return &RefusedError{Path: path, Reason: "it is a datagram or seqpacket socket; capture relays stream sockets only", Err: err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &RefusedError{Path: path, Reason: "no server is listening (a stale socket file)", Err: err, Hint: "udskit doctor " + path}
	case errors.Is(err, syscall.EACCES):
		return &RefusedError{Path: path, Reason: "no permission to connect", Err: err, Hint: "run as a user who may connect, or root"}
	}
	return &RefusedError{Path: path, Reason: "connect failed", Err: err}
}

// bindRelay binds the relay socket at tmp with the original's mode and
// owner (set before listen(2), so nobody can connect with looser bits) and
// returns the listener and the socket file's inode.
func bindRelay(tmp string, orig fs.FileInfo) (*net.UnixListener, uint64, error) {
	if fi, err := os.Lstat(tmp); err == nil {
		// A leftover relay name: remove it only if it is a socket nobody serves.
		if fi.Mode()&fs.ModeSocket == 0 || probeStream(context.Background(), tmp) == nil {
			return nil, 0, &RefusedError{Path: tmp, Reason: "something else is at the relay's temporary name", Hint: "remove it if it is yours"}
		}
		os.Remove(tmp)
	}
	st := orig.Sys().(*syscall.Stat_t)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, err
	}
	fail := func(what string, err error) (*net.UnixListener, uint64, error) {
		unix.Close(fd)
		os.Remove(tmp)
		return nil, 0, &RefusedError{Path: tmp, Reason: what, Err: err}
	}
	mode := uint32(orig.Mode().Perm())
	_ = unix.Fchmod(fd, mode)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: tmp}); err != nil {
		unix.Close(fd)
		return nil, 0, &RefusedError{Path: tmp, Reason: "cannot bind the relay socket", Err: err}
	}
	// Mode and owner without following a symlink (uds.SetSocketAttrs). A
	// non-root capture of its own socket may not be allowed the original's
	// group: then the mode alone.
	uid, gid := int(st.Uid), int(st.Gid)
	_, err = uds.SetSocketAttrs(tmp, orig.Mode(), uid, gid)
	if errors.Is(err, unix.EPERM) && uid == os.Geteuid() {
		_, err = uds.SetSocketAttrs(tmp, orig.Mode(), -1, -1)
	}
	if err != nil {
		return fail("cannot give the relay socket the original's mode and owner", err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return fail("listen", err)
	}
	var nst unix.Stat_t
	if err := unix.Lstat(tmp, &nst); err != nil {
		return fail("stat", err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return nil, 0, err
	}
	return l.(*net.UnixListener), nst.Ino, nil
}

// same reports whether name is the inode ino (not following symlinks).
func same(name string, ino uint64) bool {
	var st unix.Stat_t
	return unix.Lstat(name, &st) == nil && st.Ino == ino
}

// Path returns the interposed socket path (absolute).
func (ip *Interposer) Path() string { return ip.path }

// Stats returns the counters.
func (ip *Interposer) Stats() Stats {
	return Stats{Accepted: ip.accepted.Load(), Active: ip.active.Load(), Ended: ip.ended.Load(),
		Failed: ip.failed.Load(), Refused: ip.refused.Load()}
}

// Cut ends every relayed connection now (a second Ctrl-C).
func (ip *Interposer) Cut() { ip.cut() }

// Serve relays until ctx ends, Count connections have ended or the sink
// fails; then it restores the original socket, keeps accepting for Grace,
// and lets open connections finish for up to Drain. It returns the
// sink's error, if any, after restoring.
func (ip *Interposer) Serve(ctx context.Context) error {
	ip.mu.Lock()
	if ip.serving || ip.shutdown {
		ip.mu.Unlock()
		return errors.New("capture: Serve called twice, or after Shutdown")
	}
	ip.serving = true
	ip.mu.Unlock()
	defer close(ip.served)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		ip.acceptLoop()
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var sinkErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-ip.stop:
			break wait
		case <-ip.shut:
			break wait
		case <-tick.C:
			if sinkErr = ip.opts.Sink.Err(); sinkErr != nil {
				break wait
			}
		}
	}
	rerr := ip.restore()
	time.Sleep(ip.opts.Grace)
	// Stop the accept loop, take whatever is still queued in the backlog
	// (closing a listener resets queued connections), then close.
	ip.stopping.Store(true)
	ip.ln.SetDeadline(time.Now())
	<-acceptDone
	ip.drainBacklog()
	ip.ln.Close()
	done := make(chan struct{})
	go func() { ip.conns.Wait(); close(done) }()
	if n := ip.active.Load(); n > 0 {
		ip.log.Info("capture: socket restored; waiting for open relayed connections", "open", n, "drain", ip.opts.Drain)
	}
	select {
	case <-done:
	case <-time.After(ip.opts.Drain):
		ip.log.Warn("capture: drain time over, closing relayed connections", "open", ip.active.Load())
		ip.cut()
		<-done
	}
	ip.cut()
	if rerr != nil {
		return rerr
	}
	if sinkErr != nil {
		return fmt.Errorf("recording failed (socket restored): %w", sinkErr)
	}
	return nil
}

// Shutdown ends Serve as its ctx ending would: the original socket is put
// back, then the relayed connections get Drain to finish. When ctx ends
// first they are cut (as by Cut) and ctx's error is returned, once Serve has
// returned. Called before Serve, it restores the socket and closes the relay.
func (ip *Interposer) Shutdown(ctx context.Context) error {
	ip.mu.Lock()
	first := !ip.shutdown
	ip.shutdown = true
	serving := ip.serving
	ip.mu.Unlock()
	if first {
		close(ip.shut)
	}
	if !serving {
		err := ip.restore()
		ip.ln.Close()
		ip.cut()
		return err
	}
	select {
	case <-ip.served:
		return nil
	case <-ctx.Done():
		ip.cut()
		<-ip.served
		return ctx.Err()
	}
}

func (ip *Interposer) isRestored() bool {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	return ip.restored
}

// restore renames the original back over the path, once.
func (ip *Interposer) restore() error {
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if ip.restored {
		return nil
	}
	ip.restored = true
	err := restoreAside(ip.path, ip.origIno, ip.relayIno)
	if err == nil {
		ip.log.Info("capture: original socket restored", "path", ip.path)
	}
	return err
}

// restoreAside puts PATH+AsideSuffix (inode origIno, when known) back at
// path, if path is the relay (relayIno), is missing, or is a dead socket.
func restoreAside(path string, origIno, relayIno uint64) error {
	aside := path + AsideSuffix
	var ast unix.Stat_t
	if err := unix.Lstat(aside, &ast); err != nil {
		os.Remove(path + StateSuffix)
		return fmt.Errorf("original socket %s is gone: %w", aside, err)
	}
	if ast.Mode&unix.S_IFMT != unix.S_IFSOCK || origIno != 0 && ast.Ino != origIno {
		return fmt.Errorf("%s is not the socket capture set aside: left alone", aside)
	}
	var pst unix.Stat_t
	perr := unix.Lstat(path, &pst)
	switch {
	case perr != nil && errors.Is(perr, unix.ENOENT):
	case perr != nil:
		return perr
	case relayIno != 0 && pst.Ino == relayIno:
	case pst.Ino == ast.Ino:
		// Already back (a hard link to the same socket): drop the extra name.
		if err := os.Remove(aside); err != nil {
			return err
		}
		os.Remove(path + StateSuffix)
		return nil
	case pst.Mode&unix.S_IFMT == unix.S_IFSOCK && probeStream(context.Background(), path) != nil:
		// A dead socket that is not ours by inode (state lost): stale.
	default:
		return fmt.Errorf("%s is now another live socket (the server was restarted?); the old original is left at %s", path, aside)
	}
	if err := os.Rename(aside, path); err != nil {
		return fmt.Errorf("restore %s: %w", path, err)
	}
	os.Remove(path + StateSuffix)
	if fi, err := os.Lstat(path + TempSuffix); err == nil && fi.Mode()&fs.ModeSocket != 0 && probeStream(context.Background(), path+TempSuffix) != nil {
		os.Remove(path + TempSuffix)
	}
	return nil
}

// Restore puts back the original socket an earlier capture of path set
// aside, if any: what udskit capture --restore does. It returns what it
// did ("" with an fs.ErrNotExist error when there is nothing to restore),
// and ErrCaptureRunning when that capture is still relaying.
func Restore(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	path = abs
	st, serr := ReadState(path)
	if _, err := os.Lstat(path + AsideSuffix); err != nil {
		starting := serr == nil && unix.Kill(st.PID, 0) == nil && time.Since(st.Started) < time.Minute
		if serr == nil && !starting && !same(path, st.RelayIno) {
			// A state file with nothing aside: the capture stopped cleanly
			// except for this file, or never got as far as the link (and
			// is not just starting).
			os.Remove(path + StateSuffix)
		}
		return "", fmt.Errorf("nothing to restore at %s: %w", path, fs.ErrNotExist)
	}
	var origIno, relayIno uint64
	who := "unknown pid (no state file)"
	if serr == nil {
		origIno, relayIno = st.OrigIno, st.RelayIno
		who = fmt.Sprintf("pid %d, started %s", st.PID, st.Started.Format(time.RFC3339))
		// A capture is running if its relay socket is still at the path and
		// answers: the pid alone proves nothing (pids are reused).
		if relayIno != 0 && same(path, relayIno) && probeStream(context.Background(), path) == nil {
			return "", fmt.Errorf("%w: %s (%s); stop it with kill -TERM %d and it restores the socket itself", ErrCaptureRunning, path, who, st.PID)
		}
	} else if probeStream(context.Background(), path) == nil {
		return "", fmt.Errorf("%w: %s answers and %s has no state file; stop that capture first", ErrCaptureRunning, path, path+AsideSuffix)
	}
	if err := restoreAside(path, origIno, relayIno); err != nil {
		return "", err
	}
	return "restored the original socket set aside by a capture that did not finish (" + who + ")", nil
}

func (ip *Interposer) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := ip.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ip.stopping.Load() {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			ip.log.Error("capture: accept failed, retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		ip.start(c)
	}
}

// start relays c on its own goroutine.
func (ip *Interposer) start(c *net.UnixConn) {
	ip.accepted.Add(1)
	ip.active.Add(1)
	ip.conns.Add(1)
	go func() {
		defer ip.conns.Done()
		defer ip.active.Add(-1)
		ip.handle(c)
	}()
}

// drainBacklog accepts, without blocking, every connection still queued on
// the relay socket and relays it.
func (ip *Interposer) drainBacklog() {
	rc, err := ip.ln.SyscallConn()
	if err != nil {
		return
	}
	var fds []int
	rc.Control(func(lfd uintptr) {
		for len(fds) < 1<<16 {
			fd, _, err := unix.Accept4(int(lfd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err != nil {
				return
			}
			fds = append(fds, fd)
		}
	})
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "relay")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			continue
		}
		if uc, ok := c.(*net.UnixConn); ok {
			ip.start(uc)
		} else {
			c.Close()
		}
	}
}

// handle relays one client to the real server and records both directions.
func (ip *Interposer) handle(c *net.UnixConn) {
	start := time.Now()
	client := PeerOf(c)
	asClient, ok := ip.mayRelay(client)
	if !ok {
		ip.refused.Add(1)
		ip.log.Warn("capture: refused a client the server would see as another user", "client", client.String(),
			"hint", "run capture as root (it then connects as the client), or allow it with --any-client")
		c.Close()
		return
	}
	dctx, cancel := context.WithTimeout(ip.force, ip.opts.DialTimeout)
	up, err := dialAs(dctx, ip.aside, asClient)
	if err != nil && errors.Is(err, syscall.ENOENT) && ip.isRestored() {
		// Restored meanwhile: the original is back at the path.
		up, err = dialAs(dctx, ip.path, asClient)
	}
	cancel()
	if err != nil {
		ip.failed.Add(1)
		ip.log.Error("capture: connect to the real server failed", "server", ip.aside, "client", client.String(), "err", err)
		c.Close()
		return
	}
	server := PeerOf(up)
	note := fmt.Sprintf("interposed on %s by udskit capture pid %d", ip.path, os.Getpid())
	if asClient != nil {
		note += fmt.Sprintf("; server saw uid %d gid %d (the client's) and pid %d (the relay's)", asClient.UID, asClient.GID, os.Getpid())
	} else {
		note += fmt.Sprintf("; server saw the relay's pid %d uid %d", os.Getpid(), os.Geteuid())
	}
	rec := ip.opts.Sink.Open(ConnInfo{Socket: ip.path, Client: client, Server: server, Start: start, Note: note})
	wc, ws, pair := wrapRelay(c, up, rec)
	res := proxy.Join(ip.force, wc, ws, proxy.JoinOptions{NoSplice: true, SocketBuffer: -1})
	pair.finish(res.Err)
	if n := ip.ended.Add(1); ip.opts.Count > 0 && n >= int64(ip.opts.Count) {
		ip.stopOnce.Do(func() { close(ip.stop) })
	}
}

// mayRelay decides how to connect for a client: as the client (root
// only), as this process, or not at all.
func (ip *Interposer) mayRelay(client Peer) (asClient *uds.Cred, ok bool) {
	euid := uint32(os.Geteuid())
	if !client.Known {
		return nil, ip.opts.AnyClient
	}
	if euid == 0 {
		if client.Cred.UID == 0 && client.Cred.GID == uint32(os.Getegid()) {
			return nil, true
		}
		cr := client.Cred
		return &cr, true
	}
	if client.Cred.UID == euid || client.Cred.UID == 0 || ip.opts.AnyClient {
		return nil, true
	}
	return nil, false
}

package doctor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// Status of a check.
type Status string

// Statuses.
const (
	Pass Status = "PASS"
	Warn Status = "WARN"
	Fail Status = "FAIL"
	Skip Status = "SKIP"
)

// Check is one line of the report.
type Check struct {
	// ID is stable, for scripts: address, length, directories, dir-safety, exists, socket,
	// writable, listener, connect, upstream, protocol, shm, service, kernel, capture.
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Detail says what was found, in plain words.
	Detail string `json:"detail"`
	// Fix says what to do ("" when nothing).
	Fix string `json:"fix,omitempty"`
	// see names other checks whose lines the fix points at (comma-separated);
	// resolveSee turns it into words, citing only lines the report holds.
	see string
}

// Report is the result of Run.
type Report struct {
	Address string  `json:"address"`
	Checks  []Check `json:"checks"`
	// Connected is true when a connection succeeded (the CLI exits 0 only then).
	Connected bool `json:"connected"`
	// Cause is the ID of the first failed check, "" when none failed.
	Cause string `json:"cause,omitempty"`
	// Protocol is what the sniff recognised ("" unknown).
	Protocol string `json:"protocol,omitempty"`
	// Alternatives are live sockets of the same service found elsewhere.
	Alternatives []Alternative `json:"alternatives,omitempty"`
	// TCP is the service found on a loopback TCP port when no socket of it
	// exists on this kernel (the fix then names a udskit proxy command).
	TCP *TCPService `json:"tcp,omitempty"`
	// Stats is a udskit server's answer to udskit.stats (the shm check):
	// its connections (the doctor's own included) and shared memory.
	Stats *rpc.ServerStats `json:"stats,omitempty"`
	// udskitRefused: the server sent a udskit refusal in place of its hello.
	udskitRefused bool
}

// Failed returns the first failed check, or nil.
func (r *Report) Failed() *Check {
	for i := range r.Checks {
		if r.Checks[i].Status == Fail {
			return &r.Checks[i]
		}
	}
	return nil
}

// Get returns the check with this ID, or nil.
func (r *Report) Get(id string) *Check {
	for i := range r.Checks {
		if r.Checks[i].ID == id {
			return &r.Checks[i]
		}
	}
	return nil
}

func (r *Report) add(id string, st Status, fix string, format string, args ...any) {
	c := Check{ID: id, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix}
	r.Checks = append(r.Checks, c)
	if st == Fail && r.Cause == "" {
		r.Cause = id
	}
}

// seeAlso makes the last check's fix point at the lines of checks ids, when
// the report has them (resolveSee).
func (r *Report) seeAlso(ids ...string) {
	r.Checks[len(r.Checks)-1].see = strings.Join(ids, ",")
}

// resolveSee ends each fix that points at other checks with "(see the X line
// above, the Y line below)", naming only checks the report printed that did
// not pass: a hint never points at a line that is not there.
func (r *Report) resolveSee() {
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.see == "" {
			continue
		}
		var refs []string
		for _, id := range strings.Split(c.see, ",") {
			for j, o := range r.Checks {
				if o.ID != id || o.Status == Pass || o.Status == Skip || j == i {
					continue
				}
				where := "above"
				if j > i {
					where = "below"
				}
				refs = append(refs, "the "+id+" line "+where)
				break
			}
		}
		if len(refs) > 0 {
			c.Fix += " (see " + strings.Join(refs, ", ") + ")"
		}
		c.see = ""
	}
}

// Options configures Run. The zero value is what `udskit doctor` uses.
type Options struct {
	// Timeout bounds the connect. Default 2s.
	Timeout time.Duration
	// SniffTimeout bounds how long the sniff waits for a server to speak. Default 300ms.
	SniffTimeout time.Duration
	// Probe forces the sniff's active probe: "http", "postgres", "redis",
	// "udskit", or "none" (listen only). Default "": chosen from the socket's
	// name (.s.PGSQL.N: postgres, redis*: redis, docker.sock/podman.sock/*http*: http, *udskit*: udskit).
	Probe string
	// SearchDirs overrides, per service ("postgresql", "docker", "mysql",
	// "redis"), the directories searched for live sockets. A nil map or a
	// missing key means the usual directories (DefaultSearchDirs).
	SearchDirs map[string][]string
	// TCPPorts are loopback TCP ports to try first when looking for a
	// well-known service whose socket is missing (before its usual ports:
	// PostgreSQL the socket name's port, 5432, 5433; Redis 6379; MySQL 3306).
	TCPPorts []int
	// Root is the filesystem root for container evidence (/.dockerenv,
	// /run/.containerenv, /proc/1/cgroup). Default "/".
	Root string
	// TLS is the client configuration for a tls: address (without it the
	// doctor still reads the server's certificate, and says what is missing).
	TLS *tls.Config
	// SSH configures ssh:// addresses.
	SSH uds.SSHOptions
}

func (o *Options) defaults() {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.SniffTimeout <= 0 {
		o.SniffTimeout = 300 * time.Millisecond
	}
	if o.Root == "" {
		o.Root = "/"
	}
}

// MaxSunPath is the longest socket path connect(2) accepts on Linux, in bytes
// (sun_path is 108 bytes including the terminating NUL).
const MaxSunPath = 107

// Run diagnoses address. It never returns an error: every problem is a check.
func Run(ctx context.Context, address string, opts Options) *Report {
	r := run(ctx, address, opts)
	r.resolveSee()
	return r
}

func run(ctx context.Context, address string, opts Options) *Report {
	opts.defaults()
	r := &Report{Address: address}
	a, err := uds.ParseAddr(address)
	if err != nil {
		r.add("address", Fail, "use one of: "+uds.AddrForms, "%v", err)
		return r
	}
	r.Address = a.String()
	r.add("address", Pass, "", "%s is a %s address", a, kindWords(a.Kind))

	var (
		fi     fs.FileInfo // the socket file, when it exists
		abs    string
		snap   *socklist.Snapshot
		svc    = serviceFor(a)
		noFile bool
		// elsewhere: the server may run on another kernel (the socket is
		// missing, or no process here listens on it): the kernel hint applies.
		elsewhere bool
	)
	switch a.Kind {
	case uds.Unix:
		abs, _ = filepath.Abs(a.Name)
		tooLong := len(a.Name) > MaxSunPath
		if n := len(a.Name); tooLong {
			r.add("length", Fail, "use a shorter path: a shorter directory, a relative path after cd, or an abstract name (@name)",
				"the path is %d bytes; unix socket paths are limited to %d bytes (sun_path), so no program can connect to or listen on it", n, MaxSunPath)
		} else {
			r.add("length", Pass, "", "%d of %d bytes", n, MaxSunPath)
		}
		if !checkDirs(r, abs) {
			noFile, elsewhere = true, !tooLong
			break
		}
		checkDirSafety(r, abs)
		fi, err = os.Lstat(abs)
		if err != nil {
			noFile = true
			switch {
			case errors.Is(err, fs.ErrNotExist) && tooLong:
				r.add("exists", Fail, "use a shorter path: no server can listen at one this long",
					"%s does not exist", abs)
				r.seeAlso("length")
			case errors.Is(err, fs.ErrNotExist):
				elsewhere = true
				r.add("exists", Fail, "start the server, or point the client where the server listens",
					"%s does not exist: no server is listening there (it is not running, or it listens in another directory)", abs)
				r.seeAlso("service")
			default:
				r.add("exists", Fail, "", "cannot look at %s: %v", abs, err)
			}
			break
		}
		r.add("exists", Pass, "", "%s exists", abs)
		checkCapture(r, abs)
		if fi.Mode()&fs.ModeSymlink != 0 {
			if t, err := os.Stat(abs); err == nil {
				fi = t
			}
		}
		if !checkSocketType(r, abs, fi) {
			noFile = true
			break
		}
		checkWritable(r, abs, fi)
		snap = listSockets(ctx)
		checkListener(r, snap, abs, fi, opts.Root)
		if l := r.Get("listener"); l != nil && l.Status == Fail {
			elsewhere = true
		}
	case uds.Abstract:
		if n := len(a.Name) + 1; n > MaxSunPath+1 {
			r.add("length", Fail, "use a shorter name", "abstract name is %d bytes with its leading NUL, over the limit of %d", n, MaxSunPath+1)
		} else {
			r.add("length", Pass, "", "abstract name, %d of %d bytes; no file, directory or permission checks apply", n, MaxSunPath+1)
		}
		snap = listSockets(ctx)
		checkAbstractListener(r, snap, "@"+a.Name)
	case uds.TCP:
		r.add("length", Skip, "", "TCP address: no path, directory or permission checks")
	case uds.TLS:
		r.add("length", Skip, "", "TLS address: no path, directory or permission checks")
	case uds.SSH:
		r.add("length", Skip, "", "ssh:// address: the remote socket is checked through ssh")
	}

	var conn net.Conn
	if a.Kind == uds.TLS || a.Kind == uds.SSH {
		conn = checkRemote(ctx, r, a, opts)
	} else {
		conn = checkConnect(ctx, r, a, opts.Timeout)
	}
	if conn != nil {
		r.Connected = true
		if cr, err := uds.PeerCred(conn); err == nil {
			checkProxyUpstream(ctx, r, a, int(cr.PID), opts.Timeout) // proxy.go
		}
		sniff(ctx, r, conn, a, svc, opts)
		conn.Close()
		if r.Protocol == "udskit" && !r.udskitRefused {
			checkUdskitStats(ctx, r, a, opts) // udskit.go
		}
	} else {
		r.add("protocol", Skip, "", "no connection to sniff")
	}
	if svc != nil {
		if snap == nil {
			snap = listSockets(ctx)
		}
		serviceHints(r, svc, a, abs, snap, opts)
	}
	if !r.Connected && elsewhere && r.TCP == nil && len(r.Alternatives) == 0 {
		kernelHints(r, abs, noFile, opts.Root)
	}
	return r
}

func kindWords(k uds.Kind) string {
	switch k {
	case uds.Unix:
		return "unix socket path"
	case uds.Abstract:
		return "Linux abstract-namespace"
	case uds.TLS:
		return "TLS (TCP)"
	case uds.SSH:
		return "remote unix socket through ssh"
	}
	return "TCP"
}

func listSockets(ctx context.Context) *socklist.Snapshot {
	snap, err := socklist.List(ctx, socklist.Options{})
	if err != nil {
		return nil
	}
	return snap
}

// me describes this process's effective identity.
func me() string {
	uid, gid := os.Geteuid(), os.Getegid()
	name := strconv.Itoa(uid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username + " (uid " + strconv.Itoa(uid) + ")"
	} else {
		name = "uid " + name
	}
	return fmt.Sprintf("%s, gid %d", name, gid)
}

func owner(fi fs.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "?"
	}
	u, g := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if x, err := user.LookupId(u); err == nil {
		u = x.Username
	}
	if x, err := user.LookupGroupId(g); err == nil {
		g = x.Name
	}
	return u + ":" + g
}

// checkDirs walks the parents of abs from the root; it reports the first one
// that is missing, not a directory, or not searchable.
func checkDirs(r *Report, abs string) bool {
	dir := filepath.Dir(abs)
	var parts []string
	for d := dir; ; d = filepath.Dir(d) {
		parts = append(parts, d)
		if d == "/" || d == "." {
			break
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		d := parts[i]
		fi, err := os.Stat(d)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				r.add("directories", Fail, "create the directory, or use the directory the server actually uses",
					"directory %s does not exist, so %s cannot exist either", d, abs)
				r.seeAlso("service")
			} else {
				r.add("directories", Fail, "", "cannot look at directory %s: %v", d, err)
			}
			return false
		}
		if !fi.IsDir() {
			r.add("directories", Fail, "fix the path", "%s is a %s, not a directory", d, modeWords(fi.Mode()))
			return false
		}
		if err := accessOK(d, xOK); err != nil {
			r.add("directories", Fail,
				fmt.Sprintf("let this user through: chmod o+x %s (or g+x with a group you are in), or run as %s", d, strings.Split(owner(fi), ":")[0]),
				"directory %s (%s, owner %s) is not searchable by %s: nothing below it can be reached", d, lsMode(fi.Mode()), owner(fi), me())
			return false
		}
	}
	r.add("directories", Pass, "", "every directory down to %s exists and is searchable by %s", dir, me())
	return true
}

// checkDirSafety warns when another user could move the socket aside and
// serve in its place (uds.CheckDirs).
func checkDirSafety(r *Report, abs string) {
	risks := uds.CheckDirs(abs)
	if len(risks) == 0 {
		r.add("dir-safety", Pass, "", "no other user can replace the socket: no directory above it is writable by others without the sticky bit, no symlink on the way belongs to another user")
		return
	}
	for _, k := range risks {
		r.add("dir-safety", Warn, k.Fix, "%s", k.Problem)
	}
}

// lsMode renders a mode the way ls -l does (srwx------, drwxr-x---).
func lsMode(m fs.FileMode) string {
	s := m.String()
	if m&fs.ModeSocket != 0 && strings.HasPrefix(s, "S") {
		s = "s" + s[1:]
	}
	return s
}

func modeWords(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

func checkSocketType(r *Report, abs string, fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeSocket != 0 {
		r.add("socket", Pass, "", "%s is a socket", abs)
		return true
	}
	switch {
	case fi.IsDir():
		var socks []string
		if ents, err := os.ReadDir(abs); err == nil {
			for _, e := range ents {
				if e.Type()&fs.ModeSocket != 0 {
					socks = append(socks, filepath.Join(abs, e.Name()))
				}
			}
		}
		fix := "give the path of the socket inside the directory"
		if len(socks) > 0 {
			if len(socks) > 5 {
				socks = append(socks[:5], "...")
			}
			fix += "; sockets in it: " + strings.Join(socks, ", ")
		}
		r.add("socket", Fail, fix, "%s is a directory, not a socket", abs)
	case fi.Mode().IsRegular():
		r.add("socket", Fail,
			"find out what wrote it; if nothing needs it, remove it (rm "+abs+") and restart the server: servers refuse to replace a regular file (udskit never removes one)",
			"%s is a regular file (%d bytes, owner %s), not a socket: a program wrote a file where the socket should be, or the socket was copied through a filesystem that cannot hold sockets",
			abs, fi.Size(), owner(fi))
	default:
		r.add("socket", Fail, "remove or rename it if it is not needed, then restart the server",
			"%s is a %s, not a socket", abs, modeWords(fi.Mode()))
	}
	return false
}

func checkWritable(r *Report, abs string, fi fs.FileInfo) {
	if err := accessOK(abs, wOK); err != nil {
		r.add("writable", Fail,
			"let this user write the socket: the server's socket mode/group setting (e.g. unix_socket_permissions and unix_socket_group in PostgreSQL, "+
				"--mode for udskit serve and udskit proxy, e.g. --mode 0666), or add this user to the socket's group; or run the client as the owner",
			"%s (%s, owner %s) is not writable by %s, and connecting to a unix socket needs write permission on it", abs, lsMode(fi.Mode()), owner(fi), me())
		return
	}
	r.add("writable", Pass, "", "%s may write it (%s, owner %s)", me(), lsMode(fi.Mode()), owner(fi))
}

func procsWords(ps []socklist.Proc) string {
	if len(ps) == 0 {
		return "a process this user cannot see (another user's: run as root to name it)"
	}
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("pid %d (%s)", p.PID, p.Command))
	}
	return strings.Join(s, ", ")
}

func listenWords(l *socklist.Socket) string {
	w := procsWords(l.Procs) + " listens"
	if li := l.Listen; li != nil {
		w += fmt.Sprintf(" (%s, %d clients", l.Type, li.Clients)
		if li.Backlog >= 0 {
			w += fmt.Sprintf(", %d of backlog %d waiting in accept", li.Pending, li.Backlog)
		}
		w += ")"
	}
	return w
}

func backlogFull(l *socklist.Socket) bool {
	return l.Listen != nil && l.Listen.Backlog > 0 && l.Listen.Pending >= l.Listen.Backlog
}

func checkListener(r *Report, snap *socklist.Snapshot, abs string, fi fs.FileInfo, root string) {
	if snap == nil {
		r.add("listener", Skip, "", "could not list sockets on this system")
		return
	}
	var ls []socklist.Socket
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && snap.Source == "sock_diag" {
		ls = snap.ListenersOnFile(st.Ino, major(uint64(st.Dev)), minor(uint64(st.Dev)))
	} else {
		ls = snap.ListenersOnPath(abs)
	}
	if len(ls) == 0 {
		detail := "no process on this kernel listens on " + abs + ": the socket is stale (its server exited or crashed without removing it)"
		fix := "start the server (a careful server replaces a stale socket itself; udskit serve does); or, once sure nothing should listen here, rm " + abs
		if _, err := os.Lstat(abs + capture.AsideSuffix); err == nil {
			// Not stale: a killed capture's relay, the server's socket set aside.
			detail = "no process listens on " + abs + ": it is the relay of a udskit capture that was killed; the server's own socket is at " + abs + capture.AsideSuffix
			fix = "put the server's socket back: udskit capture --restore " + abs + " (do not rm it: that leaves the server unreachable at " + abs + ")"
		}
		if fsName := foreignFS(abs); fsName != "" {
			detail = fmt.Sprintf("no process on this kernel listens on %s, and it is on a %s filesystem: it was most likely created by another kernel "+
				"(a VM or container host sharing the directory); unix sockets do not cross kernels", abs, fsName)
			fix = "connect from the kernel that runs the server, or expose the server over TCP (or run udskit proxy next to the server) and connect to that"
		}
		r.add("listener", Fail, fix, "%s", detail)
		return
	}
	l := &ls[0]
	if backlogFull(l) {
		r.add("listener", Warn, "the server is not calling accept() fast enough (stuck or overloaded): look at "+procsWords(l.Procs)+", or raise its listen backlog",
			"%s, but its accept queue is full: new connections fail with EAGAIN", listenWords(l))
		return
	}
	r.add("listener", Pass, "", "%s", listenWords(l))
}

func checkAbstractListener(r *Report, snap *socklist.Snapshot, name string) {
	if snap == nil {
		r.add("listener", Skip, "", "could not list sockets on this system")
		return
	}
	ls := snap.ListenersOnPath(name)
	if len(ls) == 0 {
		r.add("listener", Fail, "start the server; abstract names vanish with their socket, so there is never a stale file to remove",
			"nothing listens on the abstract name %s in this network namespace (abstract names are per network namespace: a container with its own network does not share them)", name)
		return
	}
	r.add("listener", Pass, "", "%s", listenWords(&ls[0]))
}

func checkConnect(ctx context.Context, r *Report, a uds.Addr, timeout time.Duration) net.Conn {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := uds.Dial(ctx, a.String(), uds.DialOptions{})
	if err == nil {
		detail := "connected to " + a.String()
		if cr, err := uds.PeerCred(c); err == nil {
			detail += fmt.Sprintf(" (the kernel says the server is pid %d, uid %d)", cr.PID, cr.UID)
		}
		r.add("connect", Pass, "", "%s", detail)
		return c
	}
	errno := "error"
	var en syscall.Errno
	if errors.As(err, &en) {
		errno = errnoName(en)
	}
	cause := err.Error()
	var de *uds.DialError
	if errors.As(err, &de) {
		cause = de.Cause
	}
	var tl *uds.PathTooLongError
	if errors.As(err, &tl) {
		r.add("connect", Fail, "use a shorter path", "not attempted: the path does not fit in a socket address")
		r.seeAlso("length")
		return nil
	}
	fix, see := connectFix(en, a)
	r.add("connect", Fail, fix, "connect failed with %s: %s", errno, cause)
	r.seeAlso(see...)
	return nil
}

func errnoName(e syscall.Errno) string {
	names := map[syscall.Errno]string{
		syscall.ENOENT: "ENOENT", syscall.ECONNREFUSED: "ECONNREFUSED", syscall.EACCES: "EACCES",
		syscall.EPERM: "EPERM", syscall.EAGAIN: "EAGAIN", syscall.ETIMEDOUT: "ETIMEDOUT",
		syscall.ENOTDIR: "ENOTDIR", syscall.EPROTOTYPE: "EPROTOTYPE", syscall.ENOTSOCK: "ENOTSOCK",
		syscall.EINVAL: "EINVAL", syscall.ECONNRESET: "ECONNRESET", syscall.EHOSTUNREACH: "EHOSTUNREACH",
		syscall.ENETUNREACH: "ENETUNREACH",
	}
	if n, ok := names[e]; ok {
		return fmt.Sprintf("%s (%s)", n, e.Error())
	}
	return fmt.Sprintf("errno %d (%s)", int(e), e.Error())
}

// connectFix is the fix for a failed connect and the checks whose lines
// say more.
func connectFix(e syscall.Errno, a uds.Addr) (string, []string) {
	switch e {
	case syscall.ENOENT:
		return "start the server or fix the path", []string{"directories", "exists", "service"}
	case syscall.ECONNREFUSED:
		if a.Kind == uds.TCP {
			return "start the server, or check the host and port it listens on", nil
		}
		return "nothing accepts on it: start the server", []string{"socket", "listener", "service"}
	case syscall.EACCES, syscall.EPERM:
		return "fix the directory search or socket write permission", []string{"directories", "writable"}
	case syscall.EAGAIN:
		return "the server's accept queue is full: it is stuck or overloaded", []string{"listener"}
	case syscall.EPROTOTYPE:
		return "the socket is not a stream socket (datagram or seqpacket): use a client for that socket type", nil
	}
	return "", nil
}

package uds

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenFD turns an inherited listening socket into a *Listener. It takes
// ownership of fd (on error fd is left open and still the caller's) after
// checking that fd is a
// socket, of type SOCK_STREAM, in the listening state, and unix (path or
// abstract) or TCP; it sets close-on-exec. Policy and Logger of opts apply
// (a Policy on TCP is ErrPolicyOnTCP); the file options do not, since the
// socket is already bound.
//
// The socket file of an inherited listener belongs to whoever bound it, so
// Close leaves it in place unless Own is called (see Own).
func ListenFD(fd int, opts ListenOptions) (*Listener, error) {
	l, err := listenFD(fd, &opts)
	if err != nil {
		return nil, err
	}
	l.policy = opts.Policy
	l.log = opts.logger()
	return l, nil
}

func listenFD(fd int, opts *ListenOptions) (*Listener, error) {
	a, err := checkListeningSocket(fd)
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	if a.Kind == TCP && opts.Policy != nil {
		return nil, ErrPolicyOnTCP
	}
	unix.CloseOnExec(fd)
	// Work on a dup, so that fd is closed only once all went well.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err))
	}
	f := os.NewFile(uintptr(dup), a.String())
	nl, err := net.FileListener(f) // dups again
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	unix.Close(fd)
	l := &Listener{Listener: nl, addr: a}
	if a.Kind == Unix {
		l.path = a.Name
	}
	l.keepFile.Store(true)
	return l, nil
}

// checkListeningSocket returns the address of fd when it is a listening
// stream socket of a kind udskit serves.
func checkListeningSocket(fd int) (Addr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Addr{}, os.NewSyscallError("fstat", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return Addr{}, errors.New("not a socket")
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return Addr{}, os.NewSyscallError("getsockopt SO_TYPE", err)
	}
	if typ != unix.SOCK_STREAM {
		return Addr{}, fmt.Errorf("socket type %d, want a stream socket (SOCK_STREAM)", typ)
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc == 0 {
		return Addr{}, errors.New("socket is not listening (SO_ACCEPTCONN is off)")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return Addr{}, os.NewSyscallError("getsockname", err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrUnix:
		switch {
		case sa.Name == "":
			return Addr{}, errors.New("unnamed unix socket")
		case sa.Name[0] == '@' || sa.Name[0] == 0:
			return Addr{Kind: Abstract, Name: sa.Name[1:]}, nil
		}
		return Addr{Kind: Unix, Name: sa.Name}, nil
	case *unix.SockaddrInet4:
		return Addr{Kind: TCP, Name: net.JoinHostPort(net.IP(sa.Addr[:]).String(), strconv.Itoa(sa.Port))}, nil
	case *unix.SockaddrInet6:
		return Addr{Kind: TCP, Name: net.JoinHostPort(net.IP(sa.Addr[:]).String(), strconv.Itoa(sa.Port))}, nil
	}
	return Addr{}, fmt.Errorf("socket family %T is neither unix nor TCP", sa)
}

// Own claims the socket file at the listener's path for this process: Close
// will remove it (if it is still the same file and nobody answers on it).
// Call it when this process now serves an inherited socket for good, e.g.
// after a handoff commits. It fails when the path holds no socket, and for
// a relative path (bound in another process's working directory, it may name
// another file here): that file is left in place.
func (l *Listener) Own() error {
	if l.path == "" {
		return nil
	}
	if !filepath.IsAbs(l.path) {
		return fmt.Errorf("own %s: a relative path bound by another process may name another file here; leaving it", l.path)
	}
	fi, err := os.Lstat(l.path)
	if err != nil {
		return fmt.Errorf("own %s: %w", l.path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("own %s: %w", l.path, &NotSocketError{Path: l.path, What: describeMode(fi.Mode())})
	}
	l.sockID = fileIDOf(fi)
	l.keepFile.Store(false)
	return nil
}

// Release gives the socket file away: Close will no longer remove it,
// because another process serves the same socket now (a handoff).
func (l *Listener) Release() { l.keepFile.Store(true) }

// SyscallConn gives access to the listening socket's descriptor.
func (l *Listener) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := l.Listener.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// SetDeadline sets the deadline for Accept; a past time wakes a pending
// Accept with a timeout error, and accepts nothing.
func (l *Listener) SetDeadline(t time.Time) error {
	if d, ok := l.Listener.(interface{ SetDeadline(time.Time) error }); ok {
		return d.SetDeadline(t)
	}
	return errors.ErrUnsupported
}

// DupFD returns a new close-on-exec descriptor for the listening socket (for
// SendFDs). The caller closes it. The file status flags (O_NONBLOCK) are
// shared with the original, so a receiver must not switch it to blocking.
func (l *Listener) DupFD() (int, error) {
	rc, err := l.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
	}
	return nfd, nil
}

// Systemd socket activation: LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES (see
// sd_listen_fds(3)). They are read once, on the first passed-address Listen,
// and removed from the environment then, so children never inherit them.

const listenFDsStart = 3 // SD_LISTEN_FDS_START

// maxListenFDs bounds LISTEN_FDS.
const maxListenFDs = 1024

var passed struct {
	once    sync.Once
	mu      sync.Mutex
	names   map[int]string // systemd fd -> its name
	claimed map[int]bool   // fds a Listen already took
	note    string         // why there are no systemd sockets, for errors
}

func loadPassed() {
	passed.once.Do(func() {
		passed.names, passed.claimed = map[int]string{}, map[int]bool{}
		pidS, nS, namesS := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
		if nS == "" {
			passed.note = "LISTEN_FDS is not set: not started by systemd socket activation"
			return
		}
		if pid, err := strconv.Atoi(pidS); err != nil || pid != os.Getpid() {
			passed.note = fmt.Sprintf("LISTEN_PID=%q is not this process (%d): the sockets were meant for another process", pidS, os.Getpid())
			return
		}
		n, err := strconv.Atoi(nS)
		if err != nil || n < 0 || n > maxListenFDs {
			passed.note = fmt.Sprintf("LISTEN_FDS=%q is not a count from 0 to %d", nS, maxListenFDs)
			return
		}
		var names []string
		if namesS != "" {
			names = strings.Split(namesS, ":")
		}
		for i := range n {
			fd := listenFDsStart + i
			unix.CloseOnExec(fd)
			name := "unknown" // systemd's name when none is given
			if i < len(names) && names[i] != "" {
				name = names[i]
			}
			passed.names[fd] = name
		}
	})
}

// listenPassed resolves "systemd:NAME" or "fd:N" to a descriptor, claims it
// (each can be listened on once) and wraps it with ListenFD's checks.
func listenPassed(a Addr, opts *ListenOptions) (*Listener, error) {
	loadPassed()
	scheme, arg, _ := strings.Cut(a.Name, ":")
	passed.mu.Lock()
	fd := -1
	if scheme == "fd" {
		n, _ := strconv.Atoi(arg)
		if passed.claimed[n] {
			passed.mu.Unlock()
			return nil, fmt.Errorf("fd %d is already in use by another listener", n)
		}
		fd = n
	} else {
		var have []string
		for f := listenFDsStart; f < listenFDsStart+len(passed.names); f++ {
			if passed.names[f] == arg && !passed.claimed[f] {
				fd = f
				break
			}
			have = append(have, passed.names[f])
		}
		if fd < 0 {
			passed.mu.Unlock()
			if len(passed.names) == 0 {
				return nil, fmt.Errorf("no systemd socket named %q: %s", arg, passed.note)
			}
			return nil, fmt.Errorf("no unused systemd socket named %q (passed: %s); set FileDescriptorName= in the .socket unit", arg, strings.Join(have, ", "))
		}
	}
	passed.claimed[fd] = true
	passed.mu.Unlock()
	l, err := listenFD(fd, opts)
	if err != nil {
		passed.mu.Lock()
		delete(passed.claimed, fd) // still open: a retry gets the same error
		passed.mu.Unlock()
		return nil, err
	}
	return l, nil
}

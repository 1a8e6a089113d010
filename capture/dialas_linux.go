package capture

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/uds"
)

// dialAs connects to path. With cred set (the relay runs as root) the
// connect is made by a thread that has switched to the client's uid, gid
// and groups, so the server's SO_PEERCRED (and the socket file's
// permission check) see the client, not root. That thread never switches
// back: its goroutine stays locked to it and the runtime ends the thread
// when the goroutine returns.
func dialAs(ctx context.Context, path string, cred *uds.Cred) (net.Conn, error) {
	if cred == nil {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	groups := supplementaryGroups(cred.PID)
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		fd, err := connectAs(path, cred.UID, cred.GID, groups, timeout)
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	if err := unix.SetNonblock(r.fd, true); err != nil {
		unix.Close(r.fd)
		return nil, err
	}
	f := os.NewFile(uintptr(r.fd), path)
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

// connectAs runs on a locked thread: drop to uid/gid/groups for this thread
// only (raw syscalls; Go's own Setuid would change every thread), then
// connect with a send timeout bounding a full backlog.
func connectAs(path string, uid, gid uint32, groups []uint32, timeout time.Duration) (int, error) {
	var gp unsafe.Pointer
	if len(groups) > 0 {
		gp = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(gp), 0); e != 0 {
		return -1, fmt.Errorf("setgroups for the client: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return -1, fmt.Errorf("setresgid %d: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return -1, fmt.Errorf("setresuid %d: %w", uid, e)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s as uid %d: %w", path, uid, err)
	}
	zero := unix.Timeval{}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &zero)
	return fd, nil
}

// supplementaryGroups reads the Groups: line of /proc/PID/status (none when
// unreadable: the client then connects with no supplementary groups).
func supplementaryGroups(pid int32) []uint32 {
	if pid <= 0 {
		return nil
	}
	st, err := proc.ReadStatus(int(pid))
	if err != nil {
		return nil
	}
	return st.Groups()
}

package testutil

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// ShortDir makes a temp dir with a short path under os.TempDir, with the given
// permission bits (0o700 private, 0o755 for a dir another uid must search),
// removed in t.Cleanup. Socket paths must fit in 108 bytes and t.TempDir paths
// can be long, so tests that make sockets deep inside use this.
func ShortDir(t testing.TB, perm os.FileMode) string {
	t.Helper()
	d, err := os.MkdirTemp("", "udskit-")
	if err != nil {
		t.Fatalf("testutil: temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, perm); err != nil {
		t.Fatalf("testutil: chmod %s: %v", d, err)
	}
	return d
}

// ListenUnix listens on a unix stream socket at name (a path, or @name for
// the abstract namespace) with the plain net package, closed in t.Cleanup.
func ListenUnix(t testing.TB, name string) *net.UnixListener {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatalf("testutil: listen %s: %v", name, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// DialUnix connects to the unix stream socket name, closed in t.Cleanup.
func DialUnix(t testing.TB, name string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("unix", name, 5*time.Second)
	if err != nil {
		t.Fatalf("testutil: dial %s: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Accept accepts one conn on l within 5 seconds, closed in t.Cleanup.
func Accept(t testing.TB, l *net.UnixListener) net.Conn {
	t.Helper()
	l.SetDeadline(time.Now().Add(5 * time.Second))
	defer l.SetDeadline(time.Time{})
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("testutil: accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// StaleSocket leaves a stale socket at path: bound, then closed without
// unlinking, so connecting to it is refused.
func StaleSocket(t testing.TB, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("testutil: listen %s: %v", path, err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("testutil: stale socket not left at %s: %v", path, err)
	}
}

// Inode returns the inode number of path itself (a symlink is not followed),
// failing the test when path cannot be looked at.
func Inode(t testing.TB, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("testutil: %v", err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// Pair returns the two ends of a connected stream socket, network "unix" (in a
// private short temp dir) or "tcp" (on 127.0.0.1): the dialing end first, the
// accepted end second. Both are closed in t.Cleanup.
func Pair(t testing.TB, network string) (net.Conn, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = ShortDir(t, 0o700) + "/pair.sock"
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("testutil: listen %s %s: %v", network, addr, err)
	}
	defer l.Close()
	c1, err := net.DialTimeout(network, l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("testutil: dial %s: %v", l.Addr(), err)
	}
	t.Cleanup(func() { c1.Close() })
	c2, err := l.Accept()
	if err != nil {
		t.Fatalf("testutil: accept: %v", err)
	}
	t.Cleanup(func() { c2.Close() })
	return c1, c2
}

package uds

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The socket file is born with the requested mode: even under umask 0 the
// file bind(2) creates is never looser than Mode, not for a moment (before
// Listen's chmod, and long before listen(2) makes it connectable).
func TestSocketFileBornWithMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, mode := range []uint32{0o600, 0o660} {
		path := filepath.Join(t.TempDir(), "s.sock")
		fd, err := newUnixSocket()
		if err != nil {
			t.Fatal(err)
		}
		if err := presetSocketMode(fd, mode); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(path)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		if got := uint32(fi.Mode().Perm()); got != mode {
			t.Fatalf("right after bind, under umask 0: mode %o, want %o", got, mode)
		}
		// Not listening yet: nobody can connect, whatever the mode.
		if _, err := Dial(t.Context(), path, DialOptions{}); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect to a bound, not listening socket: %v, want ECONNREFUSED", err)
		}
	}
}

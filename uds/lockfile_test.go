package uds

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestListenRefusesBadLockFile: whatever sits at PATH.lock that is not a
// regular file of ours (a FIFO, which used to hang Listen forever, a
// symlink, a directory, another user's file) fails Listen at once with a
// message naming it, and is left alone.
func TestListenRefusesBadLockFile(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		make       func(p string) error
		root       bool
	}{
		{"fifo", "named pipe", func(p string) error { return syscall.Mkfifo(p, 0o600) }, false},
		{"symlink", "symbolic link", func(p string) error { return os.Symlink("/etc/passwd", p) }, false},
		{"dir", "directory", func(p string) error { return os.Mkdir(p, 0o700) }, false},
		{"other-owner", "owned by uid 65534", func(p string) error {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				return err
			}
			return os.Chown(p, 65534, 65534)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root to chown (tests run as root in CI)")
			}
			path := filepath.Join(t.TempDir(), "s.sock")
			if err := tc.make(path + ".lock"); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(path + ".lock")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			l, err := Listen(ctx, path, ListenOptions{})
			if err == nil {
				l.Close()
				t.Fatal("Listen succeeded with a bad lock file")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Listen took %v to fail", d)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path+".lock") {
				t.Errorf("error does not say what is wrong with the lock file: %v", err)
			}
			after, err2 := os.Lstat(path + ".lock")
			if err2 != nil || !os.SameFile(before, after) {
				t.Errorf("the lock file was touched: %v", err2)
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("a socket was bound anyway: %v", err)
			}
		})
	}
}

// TestListenCanceledWhileLockHeld: Listen waiting for a lock another
// process holds returns as soon as its ctx is canceled (serve's signal).
func TestListenCanceledWhileLockHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	held, err := lockFile(context.Background(), path+".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := Listen(ctx, path, ListenOptions{}); err == nil {
		t.Fatal("Listen succeeded while the lock was held")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Listen returned %v after its ctx was canceled", d-100*time.Millisecond)
	}
}

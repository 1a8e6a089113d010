package uds

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func TestCheckDirs(t *testing.T) {
	base := testutil.ShortDir(t, 0o755)
	safe := filepath.Join(base, "safe")
	open := filepath.Join(base, "open")
	sticky := filepath.Join(base, "sticky")
	for d, m := range map[string]os.FileMode{safe: 0o700, open: 0o777, sticky: 0o777 | os.ModeSticky} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, m); err != nil {
			t.Fatal(err)
		}
	}
	if r := CheckDirs(filepath.Join(safe, "s.sock")); len(r) != 0 {
		t.Errorf("private dir: %v", r)
	}
	if r := CheckDirs(filepath.Join(sticky, "s.sock")); len(r) != 0 {
		t.Errorf("sticky world-writable dir: %v", r)
	}
	r := CheckDirs("unix:" + filepath.Join(open, "sub", "s.sock"))
	if len(r) != 1 || r[0].Dir != open || !strings.Contains(r[0].Problem, "no sticky bit") || !strings.Contains(r[0].Fix, "chmod o-w "+open) {
		t.Errorf("world-writable parent above the socket: %+v", r)
	}
	// Reached through a symlink into the open dir: found on the resolved path.
	link := filepath.Join(safe, "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	if r := CheckDirs(filepath.Join(link, "s.sock")); len(r) != 1 || r[0].Dir != open {
		t.Errorf("through a symlink: %+v", r)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(safe, "other")
		if err := os.Symlink(safe, other); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(other, testutil.NobodyUID, testutil.NobodyUID); err != nil {
			t.Fatal(err)
		}
		r := CheckDirs(filepath.Join(other, "s.sock"))
		if len(r) != 1 || r[0].Dir != other || !strings.Contains(r[0].Problem, "symlink owned by uid 65534") {
			t.Errorf("symlink of another user: %+v", r)
		}
	}
	if r := CheckDirs("@abstract"); r != nil {
		t.Errorf("abstract: %v", r)
	}
	if r := CheckDirs("tcp:127.0.0.1:1"); r != nil {
		t.Errorf("tcp: %v", r)
	}
}

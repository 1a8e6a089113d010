package socklist

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// copyTestBinary copies this test binary into a fresh dir that any user may
// search, so it can be re-run as another user.
func copyTestBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "socklist-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(dir, "socklist.test")
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestListUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the check as nobody")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv not installed (util-linux)")
	}
	bin := copyTestBinary(t)
	cmd := exec.Command(setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", bin)
	cmd.Env = append(os.Environ(), "SOCKLIST_HELPER=list")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("list as nobody: %v\n%s", err, out)
	}
	var snap Snapshot
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("bad json %v: %s", err, out)
	}
	// pid 1 and this test process belong to root: nobody cannot read their fds.
	if snap.Unreadable == 0 || len(snap.Notes) == 0 || !strings.Contains(strings.Join(snap.Notes, " "), "could not read") {
		t.Fatalf("unprivileged snapshot does not say what it could not see: %+v", snap)
	}
}

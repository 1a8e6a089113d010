package uds

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// helperSwapSymlink is the attacker of TestListenNeverChmodsThroughSymlink:
// as nobody, in a directory it may write, it replaces whatever is at the
// socket path with a symlink to the target, as fast as it can, until its
// parent closes stdin. arg is "SOCKPATH|TARGET".
func helperSwapSymlink(arg string) int {
	sock, target, _ := strings.Cut(arg, "|")
	stop := make(chan struct{})
	go func() {
		testutil.Ready()
		close(stop)
	}()
	for {
		select {
		case <-stop:
			return 0
		default:
		}
		tmp := sock + ".x"
		os.Remove(tmp)
		if os.Rename(sock, tmp) == nil { // the server's fresh socket moves aside
			os.Symlink(target, sock)
		}
	}
}

// TestListenNeverChmodsThroughSymlink races a root server's Listen (Mode
// 0666) against an attacker running as nobody that swaps the fresh socket
// for a symlink to a root-owned 0600 file: the file must keep its mode and
// owner, however the race goes.
func TestListenNeverChmodsThroughSymlink(t *testing.T) {
	dir := testutil.ShortDir(t, 0o777) // writable by the attacker, no sticky bit
	secretDir := testutil.ShortDir(t, 0o755)
	target := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	testutil.StartHelper(t, testutil.NobodyCmd(t, "swapsymlink", sock+"|"+target))
	nobody := testutil.NobodyUID
	deadline := time.Now().Add(3 * time.Second)
	n := 0
	for time.Now().Before(deadline) {
		os.Remove(sock) // root may remove the attacker's symlink
		l, err := Listen(context.Background(), sock, ListenOptions{Mode: 0o666, UID: &nobody, NoMkdir: true})
		if err == nil {
			l.Close()
		}
		n++
		fi, err := os.Stat(target)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("after %d listens the symlinked target has mode %v: Listen chmod'ed through the attacker's symlink", n, fi.Mode().Perm())
		}
		if uid := fileUID(fi); uid != 0 {
			t.Fatalf("after %d listens the symlinked target is owned by uid %d: Listen chown'ed through the attacker's symlink", n, uid)
		}
	}
	t.Logf("%d listens raced", n)
}

func fileUID(fi os.FileInfo) int { return int(fi.Sys().(*syscall.Stat_t).Uid) }

package socklist

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// List on a proc tree built by the test (ProcRoot, NoDiag): the sockets of
// its /proc/net/unix, each with the processes whose fd links name it (a
// process holding one socket twice is listed once), commands from comm, and
// non-socket links, non-pid entries and a process without fds ignored.
func TestListFakeProcRoot(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "net"), 0o700))
	must(os.WriteFile(filepath.Join(root, "net/unix"), []byte(`Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 500 /run/app.sock
0000000000000000: 00000003 00000000 00000000 0001 03 501 /run/app.sock
0000000000000000: 00000003 00000000 00000000 0001 03 502
`), 0o600))
	proc := func(pid, comm string, links map[string]string) {
		dir := filepath.Join(root, pid)
		must(os.MkdirAll(filepath.Join(dir, "fd"), 0o700))
		must(os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o600))
		for fd, target := range links {
			must(os.Symlink(target, filepath.Join(dir, "fd", fd)))
		}
	}
	proc("10", "server", map[string]string{"3": "socket:[500]", "4": "socket:[501]", "5": "socket:[501]", "6": "pipe:[77]"})
	proc("20", "client", map[string]string{"0": "/dev/null", "3": "socket:[502]"})
	proc("30", "idle", nil)
	must(os.MkdirAll(filepath.Join(root, "self"), 0o700))

	snap, err := List(context.Background(), Options{ProcRoot: root, NoDiag: true})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != "/proc/net/unix" || len(snap.Sockets) != 3 {
		t.Fatalf("snapshot: source %q, %d sockets: %+v", snap.Source, len(snap.Sockets), snap.Sockets)
	}
	want := map[uint64]string{500: "10 server", 501: "10 server", 502: "20 client"}
	for _, s := range snap.Sockets {
		if len(s.Procs) != 1 {
			t.Errorf("socket %d: procs %+v, want one", s.Inode, s.Procs)
			continue
		}
		got := s.Procs[0]
		if w := want[s.Inode]; w != strconv.Itoa(got.PID)+" "+got.Command {
			t.Errorf("socket %d: %d %s, want %s", s.Inode, got.PID, got.Command, w)
		}
	}
}

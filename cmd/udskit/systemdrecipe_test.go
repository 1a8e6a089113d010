package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
)

// The systemd recipe of docs/systemd.md: its unit files (the ```ini blocks
// whose first line names the file) pass systemd-analyze verify, and the
// sidecar's ExecStart runs here under systemd-socket-activate as the units
// would run it.

type unitFile struct{ name, text string }

func systemdUnits(t *testing.T) []unitFile {
	t.Helper()
	md, err := os.ReadFile("../../docs/systemd.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []unitFile
	var cur *unitFile
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && line == "```ini":
			cur = &unitFile{}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil && cur.name == "" && cur.text == "":
			if !strings.HasPrefix(line, "# /etc/systemd/system/") {
				t.Fatalf("an ini block of docs/systemd.md does not start with its file name: %q", line)
			}
			cur.name = filepath.Base(strings.TrimPrefix(line, "# "))
			cur.text = line + "\n"
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if len(out) != 3 {
		t.Fatalf("docs/systemd.md has %d unit files, want 3 (socket, sidecar, app)", len(out))
	}
	return out
}

// execStart returns the ExecStart= command of a unit.
func execStart(t *testing.T, u unitFile) []string {
	for _, l := range strings.Split(u.text, "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("%s has no ExecStart=", u.name)
	return nil
}

func TestSystemdRecipeVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not installed; scripts/install-deps.sh installs the systemd package")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var paths []string
	for _, u := range systemdUnits(t) {
		// The binaries the units name, as ones that exist here.
		text := strings.ReplaceAll(u.text, "/usr/local/bin/udskit", exe)
		text = strings.ReplaceAll(text, "/usr/local/bin/app", "/bin/true")
		p := filepath.Join(dir, u.name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check can fail: a misspelt key is reported.
	bad := strings.Replace(string(mustRead(t, paths[1])), "Type=notify", "Typ=notify", 1)
	os.WriteFile(paths[1], []byte(bad), 0o644)
	if out, _ := exec.Command(sa, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput(); !bytes.Contains(out, []byte("Unknown key")) {
		t.Fatalf("systemd-analyze verify did not report a misspelt key: %s", out)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSystemdRecipeRuns: the sidecar's ExecStart under systemd-socket-
// activate (the socket unit's FileDescriptorName) with a notify socket:
// READY=1 once serving; on SIGTERM STOPPING=1, and it keeps answering the
// connected client and new ones until the last has gone (after the min
// grace), then exits 0 leaving systemd's socket file in place.
func TestSystemdRecipeRuns(t *testing.T) {
	units := systemdUnits(t)
	var fdname string
	for _, l := range strings.Split(units[0].text, "\n") {
		if v, ok := strings.CutPrefix(l, "FileDescriptorName="); ok {
			fdname = v
		}
	}
	args := execStart(t, units[1])
	if filepath.Base(args[0]) != "udskit" || args[2] != "systemd:"+fdname {
		t.Fatalf("the sidecar's ExecStart %q does not serve the socket unit's systemd:%s", args, fdname)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	args = args[1:]
	for i := range args {
		if i > 0 && args[i-1] == "--allow-uid" {
			args[i] = me.Username // the units' users, as the one running here
		}
	}
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "sidecar.sock")
	notify, notes := testutil.NotifySocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := startInstance(t, testutil.SocketActivated(t, scCLI(ctx, args...), sock, fdname, "NOTIFY_SOCKET="+notify))
	testutil.WaitFor(t, "systemd-socket-activate to bind", func() bool { _, err := os.Lstat(sock); return err == nil })
	c, err := rpc.Dial(ctx, "unix:"+sock, rpc.ClientOptions{Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var who struct{ PID int }
	if err := c.Call(ctx, "whoami", nil, &who); err != nil || who.PID != os.Getpid() {
		t.Fatalf("whoami through the activated socket: %+v %v", who, err)
	}
	if got := testutil.NextNotify(t, notes); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	term := time.Now()
	in.cmd.Process.Signal(syscall.SIGTERM)
	if got := testutil.NextNotify(t, notes); got != "STOPPING=1" {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", got)
	}
	time.Sleep(300 * time.Millisecond)
	if err := c.Call(ctx, "whoami", nil, &who); err != nil {
		t.Fatalf("the connected client's call while lingering: %v", err)
	}
	if r := scRun(t, "", "call", "unix:"+sock, "echo", `{"new":1}`); r.code != 0 {
		t.Fatalf("a new client while lingering: exit %d %s", r.code, r.stderr)
	}
	select {
	case err := <-in.done:
		t.Fatalf("the sidecar exited (%v) with a client connected", err)
	default:
	}
	c.Close()
	in.wait(t, 10*time.Second)
	if el := time.Since(term); el < 2*time.Second {
		t.Errorf("the sidecar exited %v after SIGTERM, before its --drain-min-grace 2s", el)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("udskit removed systemd's socket file: %v", err)
	}
}

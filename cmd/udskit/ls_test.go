package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestLsJSONAndTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cli.sock")
	l := testutil.ListenUnix(t, path)
	testutil.DialUnix(t, path)

	out, err := runCLI(t, "ls", "--listening", "--json", path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Sockets []struct {
			Path   string                         `json:"path"`
			Mode   string                         `json:"mode"`
			Owner  string                         `json:"owner"`
			State  string                         `json:"state"`
			Procs  []struct{ PID int }            `json:"procs"`
			Listen struct{ Clients, Pending int } `json:"listen"`
		} `json:"sockets"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json is not valid JSON: %v\n%s", err, out)
	}
	if len(doc.Sockets) != 1 || doc.Sockets[0].Path != path || doc.Sockets[0].State != "listening" ||
		doc.Sockets[0].Listen.Clients != 1 || doc.Sockets[0].Listen.Pending != 1 ||
		len(doc.Sockets[0].Procs) != 1 || doc.Sockets[0].Procs[0].PID != os.Getpid() {
		t.Fatalf("unexpected: %s", out)
	}
	// The socket file's mode and owner (who may connect), in JSON and the table.
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
	me, _ := user.Current()
	out, err = runCLI(t, "ls", "--listening", "--json", path)
	if err != nil || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Sockets) != 1 ||
		doc.Sockets[0].Mode != "srw-rw----" || !strings.HasPrefix(doc.Sockets[0].Owner, me.Username+":") {
		t.Fatalf("mode/owner in --json: %v\n%s", err, out)
	}
	out, err = runCLI(t, "ls", "cli.sock")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, path) || !strings.Contains(out, "1 client (0 accepted, 1 pending)") ||
		!strings.Contains(strings.SplitN(out, "\n", 2)[0], "MODE") || !strings.Contains(out, "srw-rw----") || !strings.Contains(out, me.Username+":") {
		t.Fatalf("table:\n%s", out)
	}
	// A second client, accepted: plural count, one accepted client's pid.
	testutil.DialUnix(t, path)
	testutil.Accept(t, l)
	out, err = runCLI(t, "ls", "cli.sock")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "2 clients (1 accepted, 1 pending)") || !strings.Contains(out, fmt.Sprintf("client pid %d", os.Getpid())) {
		t.Fatalf("table with two clients:\n%s", out)
	}
}

// --pid keeps only the sockets that pid holds: the test's listener is shown
// for this process and not for pid 1.
func TestLsPidFilter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pid.sock")
	testutil.ListenUnix(t, path)
	out, err := runCLI(t, "ls", "--pid", strconv.Itoa(os.Getpid()), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Sockets []struct {
			Path  string              `json:"path"`
			Procs []struct{ PID int } `json:"procs"`
		} `json:"sockets"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	found := false
	for _, s := range doc.Sockets {
		mine := false
		for _, p := range s.Procs {
			mine = mine || p.PID == os.Getpid()
		}
		if !mine {
			t.Errorf("--pid %d listed a socket it does not hold: %+v", os.Getpid(), s)
		}
		found = found || s.Path == path
	}
	if !found {
		t.Fatalf("--pid %d does not list its listener %s:\n%s", os.Getpid(), path, out)
	}
	out, err = runCLI(t, "ls", "--pid", "1", "pid.sock")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, path) {
		t.Fatalf("--pid 1 lists this test's socket:\n%s", out)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	out, err = runCLI(t, "ls", "cli.sock")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, path) || !strings.Contains(out, "1 client (0 accepted, 1 pending)") {
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

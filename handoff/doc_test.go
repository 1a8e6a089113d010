package handoff

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDocExampleRuns runs the Go program in docs/handoff.md as pasted.
func TestDocExampleRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program")
	}
	md, err := os.ReadFile(filepath.Join("..", "docs", "handoff.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(md), "```go\n")
	src, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 || !strings.Contains(src, "package main") {
		t.Fatal("docs/handoff.md has no Go program")
	}
	// Inside the module (so its imports resolve), in a dir ./... skips.
	dir, err := os.MkdirTemp(".", "_docexample")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "./"+dir).Output()
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	if got, want := string(out), "state: {\"generation\":1}\nanswered by: new\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

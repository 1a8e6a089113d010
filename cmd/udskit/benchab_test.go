package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestBenchABScript runs scripts/bench-ab.sh (docs/performance.md's A/B
// command) on two "builds" (this test binary as the CLI) with a tiny request
// count: it must print a row per build and round (req/s, CPU and p50, each
// against the floor) and the medians, and
// refuse bad arguments with exit 2 and a message that says what to do.
func TestBenchABScript(t *testing.T) {
	script, err := filepath.Abs("../../scripts/bench-ab.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	wrap := filepath.Join(dir, "udskit")
	body := "#!/bin/sh\nUDSKIT_TEST_AS_CLI=1 GORACE='atexit_sleep_ms=0' exec " + os.Args[0] + " \"$@\"\n"
	if err := os.WriteFile(wrap, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "CONC=2")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}

	out, code := run("1KiB", "300", "2", wrap, wrap)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if n := len(regexp.MustCompile(`(?m)^round [12] +\S+ +req/s +[1-9]\d* +cpu +[\d.]+ µs +p50 +[1-9][\d.]* µs +\| raw req/s +[1-9]\d* .*p50/raw [\d.]+$`).FindAllString(out, -1)); n != 4 {
		t.Errorf("%d result rows, want 4 (2 rounds × 2 builds):\n%s", n, out)
	}
	for _, want := range []string{"size 1KiB, 2 callers, 2 rounds of 300 requests (medians):", "raw-unix (floor)", "rpc/raw", "p50/raw"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	if out, code := run(); code != 2 || !strings.Contains(out, "SIZE REQUESTS ROUNDS BIN") {
		t.Errorf("no arguments: exit %d, want 2 and the usage:\n%s", code, out)
	}
	missing := filepath.Join(dir, "nope")
	if out, code := run("1KiB", "300", "1", missing); code != 2 || !strings.Contains(out, "go build -o "+missing) {
		t.Errorf("missing binary: exit %d, want 2 and how to build one:\n%s", code, out)
	}
}

package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGTERM with a call that outlives --drain-timeout: serve waits for the
// timeout, not for the call, closes the connection, says so and exits 0.
func TestServeDrainTimeoutClosesSlowCall(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "dt.sock")
	s := scServe(t, sock, "--drain-timeout", "400ms")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := scCLI(ctx, "call", s.addr, "sleep", `{"ms":8000}`, "--timeout", "20s")
	var out, errb bytes.Buffer
	call.Stdout, call.Stderr = &out, &errb
	if err := call.Start(); err != nil {
		t.Fatal(err)
	}
	waitLog(t, "serve", s.stderr, "msg=connect")
	time.Sleep(200 * time.Millisecond) // the request is in flight
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s.wait(t, 6*time.Second); err != nil {
		t.Fatalf("serve exited with %v after the drain timeout; log %s", err, s.stderr)
	}
	if el := time.Since(start); el < 350*time.Millisecond || el > 5*time.Second {
		t.Errorf("serve exited %v after SIGTERM; want about the 400ms --drain-timeout", el)
	}
	if log := s.stderr.String(); !strings.Contains(log, "drain timeout: closed the remaining connections") {
		t.Errorf("serve log does not say the drain timed out:\n%s", log)
	}
	if err := call.Wait(); err == nil || out.Len() != 0 {
		t.Errorf("the 8s call succeeded (%q) although the drain timed out after 400ms", out.String())
	}
}

package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// TestServeSIGTERMWhileListening: a serve stuck in Listen (here: another
// process holds PATH.lock) stops at once on SIGTERM, with exit code 1.
func TestServeSIGTERMWhileListening(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "held.sock")
	f, err := os.OpenFile(sock+".lock", os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	cmd := scCLI(context.Background(), "serve", sock)
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("serve took %v to stop after SIGTERM", el)
		}
		if cmd.ProcessState.ExitCode() != 1 {
			t.Errorf("exit code %d, want 1; stderr %s", cmd.ProcessState.ExitCode(), stderr.String())
		}
	case <-time.After(4 * time.Second):
		t.Fatalf("serve still running 4s after SIGTERM while stuck in Listen; stderr %s", stderr.String())
	}
}

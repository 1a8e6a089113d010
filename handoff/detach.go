package handoff

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// envReportFD names the descriptor on which a detached successor reports
// its takeover to the launcher (RunDetached).
const envReportFD = "UDSKIT_HANDOFF_REPORT_FD"

var reportOnce sync.Once

// reportDetached writes line to the launcher's pipe, once, and closes it.
func reportDetached(line string) {
	reportOnce.Do(func() {
		s := os.Getenv(envReportFD)
		os.Unsetenv(envReportFD)
		fd, err := strconv.Atoi(s)
		if err != nil || fd < 3 {
			return
		}
		f := os.NewFile(uintptr(fd), "handoff-report")
		fmt.Fprintln(f, line)
		f.Close()
	})
}

// RunDetached starts this executable with args as a new session (it
// outlives the caller, e.g. systemd's ExecReload= command), and waits until
// that successor has committed its takeover or failed. It is how a reload
// command can be synchronous while the new server lives on.
func RunDetached(ctx context.Context, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{w}
	cmd.Env = append(os.Environ(), envReportFD+"=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if strings.HasPrefix(s, "committed") {
			return nil
		}
		if s == "" {
			err := <-exited
			return fmt.Errorf("handoff: the successor exited before taking over: %v", err)
		}
		return errors.New("handoff: successor: " + strings.TrimPrefix(s, "error: "))
	case <-ctx.Done():
		return ctx.Err()
	}
}

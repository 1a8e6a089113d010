package uds

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a helper process (another pid, another uid via
// setpriv) when UDSKIT_TEST_HELPER is set.
func TestMain(m *testing.M) {
	switch os.Getenv("UDSKIT_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "dial":
		helperDial(os.Getenv("UDSKIT_TEST_ADDR"))
	case "listen":
		helperListen(os.Getenv("UDSKIT_TEST_ADDR"))
	default:
		fmt.Fprintln(os.Stderr, "unknown helper")
		os.Exit(2)
	}
	os.Exit(0)
}

// helperResult is what the dial helper prints as JSON.
type helperResult struct {
	UID   int    `json:"uid"`
	Err   string `json:"err,omitempty"`
	Errno string `json:"errno,omitempty"`
	Read  string `json:"read"`
}

func helperDial(addr string) {
	res := helperResult{UID: os.Getuid()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, DialOptions{})
	if err != nil {
		res.Err = err.Error()
		for _, e := range []syscall.Errno{syscall.EACCES, syscall.ENOENT, syscall.ECONNREFUSED} {
			if errors.Is(err, e) {
				res.Errno = e.Error()
			}
		}
	} else {
		c.Write([]byte("ping\n"))
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		res.Read = string(b)
		if err != nil {
			res.Err = err.Error()
		}
		c.Close()
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

func helperListen(addr string) {
	l, err := Listen(context.Background(), addr, ListenOptions{})
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer l.Close()
	fmt.Println("ready")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	io.Copy(io.Discard, os.Stdin) // run until the parent closes stdin
}

// helperCmd returns a command running this test binary as a helper.
func helperCmd(t *testing.T, mode, addr string, prefix ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, prefix...), exe, "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "UDSKIT_TEST_HELPER="+mode, "UDSKIT_TEST_ADDR="+addr)
	cmd.Stderr = os.Stderr
	return cmd
}

// startListenHelper starts a child process listening on addr and returns it
// once it is ready; t.Cleanup stops it.
func startListenHelper(t *testing.T, addr string) *exec.Cmd {
	t.Helper()
	cmd := helperCmd(t, "listen", addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("listen helper: %q %v", line, err)
	}
	return cmd
}

// nobodyEnv prepares a world-searchable directory holding a copy of the test
// binary that uid nobody can execute, and returns the directory and the
// command prefix that runs a program as nobody.
func nobodyEnv(t *testing.T) (dir string, run func(mode, addr string) helperResult) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another uid (tests run as root in CI)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed; scripts/install-deps.sh installs it")
	}
	dir, err = os.MkdirTemp("", "udskit-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "uds.test")
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	run = func(mode, addr string) helperResult {
		t.Helper()
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "UDSKIT_TEST_HELPER="+mode, "UDSKIT_TEST_ADDR="+addr)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper as nobody: %v: %s", err, out)
		}
		var res helperResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("helper output %q: %v", out, err)
		}
		if res.UID != 65534 {
			t.Fatalf("helper ran as uid %d, want 65534", res.UID)
		}
		return res
	}
	return dir, run
}

// stalePath leaves a stale socket (bound, then closed without unlink) at path.
func stalePath(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket not left behind: %v", err)
	}
}

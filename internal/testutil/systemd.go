package testutil

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SocketActivated wraps cmd (a HelperCmd, or the test binary as a CLI) to
// run under the real systemd-socket-activate, which binds a unix socket at
// path and passes it as fd 3 named name on the first connect. cmd's UDSKIT_*
// and GORACE variables and extra KEY=VALUEs are passed on (the tool passes
// on only what it is told).
func SocketActivated(t testing.TB, cmd *exec.Cmd, path, name string, extra ...string) *exec.Cmd {
	t.Helper()
	ssa, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Fatal("systemd-socket-activate not installed; scripts/install-deps.sh installs the systemd package")
	}
	args := []string{"-l", path, "--fdname=" + name}
	for _, kv := range cmd.Env {
		if strings.HasPrefix(kv, "UDSKIT_") || strings.HasPrefix(kv, "GORACE=") {
			args = append(args, "-E", kv)
		}
	}
	for _, kv := range extra {
		args = append(args, "-E", kv)
	}
	out := exec.Command(ssa, append(args, cmd.Args...)...)
	out.Stdout, out.Stderr = cmd.Stdout, cmd.Stderr
	return out
}

// NotifySocket stands in for systemd's $NOTIFY_SOCKET: a unixgram socket in
// a private dir whose path it returns, with every datagram on the channel.
func NotifySocket(t testing.TB) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(ShortDir(t, 0o700), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 64)
	go func() {
		defer close(out)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			out <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { c.Close() })
	return path, out
}

// NextNotify returns the next datagram from NotifySocket's channel, failing
// the test after 20 seconds.
func NextNotify(t testing.TB, ch <-chan string) string {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("notify socket closed")
		}
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no notification within 20s")
	}
	return ""
}

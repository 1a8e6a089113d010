package sdnotify

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen stands in for systemd: a unixgram socket named by NOTIFY_SOCKET.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return c
}

func recv(t *testing.T, c *net.UnixConn) (string, []int) {
	t.Helper()
	buf := make([]byte, MaxMessage)
	oob := make([]byte, unix.CmsgSpace(4*4))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for i := range msgs {
			f, _ := unix.ParseUnixRights(&msgs[i])
			fds = append(fds, f...)
		}
	}
	return string(buf[:n]), fds
}

func TestNotifications(t *testing.T) {
	c := listen(t)
	for _, tc := range []struct {
		send func() error
		want string
	}{
		{Ready, "READY=1"},
		{func() error { return Status("serving\n3 clients") }, "STATUS=serving 3 clients"},
		{Stopping, "STOPPING=1"},
		{func() error { return MainPID(4242) }, "MAINPID=4242\nREADY=1"},
	} {
		if err := tc.send(); err != nil {
			t.Fatal(err)
		}
		if got, _ := recv(t, c); got != tc.want {
			t.Fatalf("got %q, want %q", got, tc.want)
		}
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := FDStore("api", []int{int(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	got, fds := recv(t, c)
	if got != "FDSTORE=1\nFDNAME=api" || len(fds) != 1 {
		t.Fatalf("fd store: %q %v", got, fds)
	}
	var a, b unix.Stat_t
	unix.Fstat(fds[0], &a)
	unix.Fstat(int(f.Fd()), &b)
	unix.Close(fds[0])
	if a.Ino != b.Ino {
		t.Fatal("stored fd is another file")
	}
	if FDStore("a:b", []int{0}) == nil || FDStore("x", nil) == nil {
		t.Fatal("bad fd store names or empty fds accepted")
	}
}

func TestNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if Enabled() || Ready() != nil || MainPID(1) != nil {
		t.Fatal("without NOTIFY_SOCKET calls must be silent no-ops")
	}
	t.Setenv("NOTIFY_SOCKET", "relative")
	if Ready() == nil {
		t.Fatal("a NOTIFY_SOCKET that is no path accepted")
	}
}

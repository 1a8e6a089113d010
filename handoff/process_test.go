package handoff

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func notifySocket(t *testing.T) <-chan string {
	path, ch := testutil.NotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", path)
	return ch
}

func expectNotify(t *testing.T, ch <-chan string, want ...string) {
	t.Helper()
	for _, w := range want {
		if got := testutil.NextNotify(t, ch); got != w {
			t.Fatalf("notification %q, want %q", got, w)
		}
	}
}

// TestProcessChainNotifiesSystemd: a fresh Process says READY=1; a
// takeover makes the old one name the successor (MAINPID=) before it is
// told of the commit, and the successor says MAINPID=self and READY=1.
func TestProcessChainNotifiesSystemd(t *testing.T) {
	notes := notifySocket(t)
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "p.sock")
	opts := ProcessOptions{Control: ControlPath(sock), Logger: quiet}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p1, err := Start(ctx, []Spec{{Name: "rpc", Address: sock, Listen: uds.ListenOptions{Logger: quiet}}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	s1 := serveTag(p1.Listener("rpc"), "one")
	if res, err := p1.Ready(ctx); err != nil || res != nil {
		t.Fatalf("fresh Ready: %v %v", res, err)
	}
	expectNotify(t, notes, "READY=1")

	opts.Takeover = true
	p2, err := Start(ctx, []Spec{{Name: "rpc", Listen: uds.ListenOptions{Logger: quiet}}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	s2 := serveTag(p2.Listener("rpc"), "two")
	defer s2.srv.Close()
	defer p2.Close()
	res, err := p2.Ready(ctx)
	if err != nil || res == nil || res.Serving <= 0 || res.Serving > res.Confirmed {
		t.Fatalf("takeover Ready: %+v %v", res, err)
	}
	pid := strconv.Itoa(os.Getpid())
	expectNotify(t, notes, "MAINPID="+pid, "MAINPID="+pid+"\nREADY=1")
	select {
	case <-p1.Committed():
	case <-time.After(5 * time.Second):
		t.Fatal("the first process was not told to stop")
	}
	s1.srv.Shutdown(ctx)
	p1.Close()
	if got := ask(t, sock); got != "two" {
		t.Fatalf("answered by %q", got)
	}
}

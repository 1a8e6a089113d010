package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
)

// TestProxyDrainLinger: `proxy --drain linger` keeps its socket and accepts
// after SIGTERM (a new client is relayed), and exits within a second once
// the last client has gone.
func TestProxyDrainLinger(t *testing.T) {
	up := pxEcho(t)
	front := filepath.Join(testutil.ShortDir(t, 0o700), "front.sock")
	p := pxStart(t, 1, "--listen", front, "--to", up, "--drain", "linger", "--drain-timeout", "20s")
	c1 := pxDial(t, p.listens[0])
	pxRoundTrip(t, c1, "before")
	p.signal(syscall.SIGTERM)
	pxWaitLog(t, p, "proxy draining (linger)")
	time.Sleep(300 * time.Millisecond)
	c2 := pxDial(t, p.listens[0])
	pxRoundTrip(t, c2, "new client while lingering")
	pxRoundTrip(t, c1, "old client while lingering")
	c1.Close()
	c2.Close()
	closed := time.Now()
	if err := p.wait(t, 5*time.Second); err != nil {
		t.Fatalf("proxy exited with %v:\n%s", err, p.stderr)
	}
	if el := time.Since(closed); el > time.Second {
		t.Errorf("proxy exited %v after its last client left; want within 1s", el)
	}
	if !strings.Contains(p.stderr.String(), "proxy drained; stopped") {
		t.Errorf("proxy log lacks the drained line:\n%s", p.stderr)
	}
}

// The drain flags' mistakes are bad usage (exit 2) with a message that
// says what to change.
func TestDrainFlagsBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "/tmp/x.sock", "--drain", "wait"}, `--drain: drain mode "wait": want goaway or linger`},
		{[]string{"serve", "/tmp/x.sock", "--drain-min-grace", "1s"}, "--drain-min-grace goes with --drain linger"},
		{[]string{"serve", "/tmp/x.sock", "--drain", "linger", "--drain-min-grace", "10s"}, "must be shorter than --drain-timeout"},
		{[]string{"serve", "/tmp/x.sock", "--drain", "linger", "--drain-min-grace", "-1s"}, "cannot be negative"},
		{[]string{"proxy", "--listen", "/tmp/x.sock", "--to", "/tmp/y.sock", "--drain", "later"}, `want goaway or linger`},
		{[]string{"serve", "tcp:127.0.0.1:0", "--handoff"}, "cannot be derived from these addresses"},
		{[]string{"serve", "/tmp/x.sock", "--detach"}, "--detach goes with --handoff"},
	} {
		r := scRun(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("udskit %s: exit %d, stderr %q; want exit 2 mentioning %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
}

// A successor's takeover drains by goaway even with --drain linger: the
// successor accepts on the same socket, so the old instance's clients
// move to it instead of holding the old one until --drain-timeout.
func TestHandoffDrainsByGoawayUnderLinger(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "hl.sock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := startInstance(t, scCLI(ctx, "serve", sock, "--drain", "linger", "--drain-timeout", "30s"))
	old.line(t, "listening on")
	c, err := rpc.Dial(ctx, "unix:"+sock, rpc.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var who struct{ PID int }
	if err := c.Call(ctx, "whoami", nil, &who); err != nil {
		t.Fatal(err)
	}
	next := startInstance(t, scCLI(ctx, "serve", sock, "--handoff", "--drain", "linger", "--drain-timeout", "30s"))
	next.line(t, "took over from pid")
	took := time.Now()
	old.wait(t, 10*time.Second)
	if el := time.Since(took); el > 5*time.Second {
		t.Errorf("the old instance took %v to go after the takeover; want it to move its client at once, not linger", el)
	}
	if log := old.stderr.String(); !strings.Contains(log, "draining: not accepting") || strings.Contains(log, "(linger)") {
		t.Errorf("the old instance did not drain by goaway:\n%s", log)
	}
	if err := c.Call(ctx, "whoami", nil, &who); err != nil || who.PID == 0 {
		t.Fatalf("the client after the takeover: %+v %v", who, err)
	}
	next.cmd.Process.Signal(syscall.SIGTERM)
	c.Close()
	next.wait(t, 15*time.Second)
}

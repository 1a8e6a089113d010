package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
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

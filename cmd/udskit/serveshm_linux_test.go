package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
)

// TestServeShm: `udskit serve` accepts a Go client's shared-memory offer by
// default and a 64 KiB echo goes through the region; with --no-shm the
// same call stays on the socket.
func TestServeShm(t *testing.T) {
	payload := []byte(`"` + strings.Repeat("x", 64<<10) + `"`)
	for _, tc := range []struct {
		args []string
		shm  bool
	}{{nil, true}, {[]string{"--no-shm"}, false}} {
		s := scServe(t, append([]string{filepath.Join(t.TempDir(), "s.sock")}, tc.args...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := rpc.Dial(ctx, s.addr, rpc.ClientOptions{Conns: 1, LargeConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.CallRaw(ctx, "echo", payload, nil)
		if err != nil || !bytes.Equal(bytes.TrimSpace(out), payload) {
			t.Fatalf("serve %v: echo: %v", tc.args, err)
		}
		if st := c.ShmStats(); (st.Conns == 1 && st.Sent == 1 && st.Received == 1) != tc.shm || (st.Conns != 0) != tc.shm {
			t.Fatalf("serve %v: client shm stats %+v, want shared memory %v", tc.args, st, tc.shm)
		}
		c.Close()
		cancel()
	}
}

// TestCallNoShm: `udskit call` offers shared memory by default, so its 64
// KiB echo goes through the region (udskit.stats of the `udskit serve`
// process counts one payload each way); with --no-shm the same call stays
// on the socket and the counters do not move.
func TestCallNoShm(t *testing.T) {
	s := scServe(t, filepath.Join(t.TempDir(), "s.sock"))
	payload := strings.Repeat("x", 64<<10)
	received := func() uint64 {
		t.Helper()
		r := scRun(t, "", "call", s.addr, rpc.StatsMethod)
		var st rpc.ServerStats
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || !st.Shm.Enabled {
			t.Fatalf("udskit call %s %s: exit %d, %q %s", s.addr, rpc.StatsMethod, r.code, r.stdout, r.stderr)
		}
		return st.Shm.Received
	}
	for _, tc := range []struct {
		args []string
		shm  bool
	}{{nil, true}, {[]string{"--no-shm"}, false}, {[]string{"--no-shm", "-n", "5", "-c", "2"}, false}, {[]string{"-n", "5", "-c", "2"}, true}} {
		before := received()
		r := scRun(t, payload, append([]string{"call", "--raw", s.addr, "echo"}, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("udskit call %v: exit %d: %s", tc.args, r.code, r.stderr)
		}
		if load := slices.Contains(tc.args, "-n"); !load && r.stdout != payload || load && !strings.Contains(r.stdout, "ok 5 ") {
			t.Fatalf("udskit call %v: unexpected output (%d bytes): %.200s", tc.args, len(r.stdout), r.stdout)
		}
		if got := received() - before; (got > 0) != tc.shm {
			t.Fatalf("udskit call %v: %d requests through shared memory, want shared memory %v", tc.args, got, tc.shm)
		}
	}
	if r := scRun(t, "", "call", "--help"); !strings.Contains(r.stdout, "--no-shm") {
		t.Fatal("call --help lacks --no-shm")
	}
}

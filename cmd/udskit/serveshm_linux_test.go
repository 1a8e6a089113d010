package main

import (
	"bytes"
	"context"
	"path/filepath"
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

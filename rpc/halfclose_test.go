package rpc

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// halfClose shuts down the sending side of c (shutdown(SHUT_WR)).
func halfClose(t *testing.T, c net.Conn) {
	t.Helper()
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("%T cannot half-close", c)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
}

// TestNDJSONHalfClose: a newline-JSON client that sends its requests and
// half-closes gets every reply, then EOF. EOF means "no more requests", not
// "drop what is in flight".
func TestNDJSONHalfClose(t *testing.T) {
	addr := startServer(t, ndjsonServer())
	c, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lines := `{"id":1,"func":"slowEcho","data":{"i":1,"ms":150}}` + "\n" +
		`{"id":2,"func":"getService","data":{"service":"x"}}` + "\n" +
		`{"id":3,"func":"noSuchFunc"}` + "\n" +
		`{"id":4,"func":"slowEcho","data":{"i":4,"ms":50}}` + "\n"
	if _, err := io.WriteString(c, lines); err != nil {
		t.Fatal(err)
	}
	halfClose(t, c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	out, err := io.ReadAll(c) // also checks that the server closes after the replies
	if err != nil {
		t.Fatalf("read replies: %v (got %q)", err, out)
	}
	var ids []int
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("reply %q: %v", l, err)
		}
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []int{1, 2, 3, 4}) {
		t.Fatalf("replies for ids %v, want 1..4; got:\n%s", ids, out)
	}
}

// TestNDJSONHalfCloseSocat is the report's reproduction, verbatim:
// printf '...\n' | socat - UNIX-CONNECT:S
func TestNDJSONHalfCloseSocat(t *testing.T) {
	socat, err := exec.LookPath("socat")
	if err != nil {
		t.Skip("socat is not installed")
	}
	s := ndjsonServer()
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		time.Sleep(20 * time.Millisecond) // the reply is still in flight at EOF
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, socat, "-", "UNIX-CONNECT:"+strings.TrimPrefix(addr, "unix:"))
	cmd.Stdin = strings.NewReader(`{"id":1,"func":"echo","data":"x"}` + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("socat: %v\n%s", err, out)
	}
	if got, want := string(out), `{"id":1,"data":"x"}`+"\n"; got != want {
		t.Fatalf("socat printed %q, want %q", got, want)
	}
}

// TestFramedHalfClose: the same for a udskit client: requests, then
// shutdown(SHUT_WR); every response arrives, then the server closes.
func TestFramedHalfClose(t *testing.T) {
	s := echoServer()
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		select {
		case <-time.After(150 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	c, r := rawPeer(t, addr)
	w := frame.NewWriter(c)
	for id, m := range map[uint32]string{1: "slow", 2: "echo", 3: "slow", 4: "nope"} {
		h := frame.Header{Type: frame.TypeRequest, ID: id}
		if err := w.WriteFrame(&h, frame.AppendRequestHead(nil, m), []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	halfClose(t, c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := map[uint32]string{}
	for {
		f, err := r.ReadFrame(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		switch f.Type {
		case frame.TypeResponse:
			got[f.ID] = string(f.Payload)
		case frame.TypeError:
			got[f.ID] = "error " + Code(f.Aux).String()
		}
	}
	want := map[uint32]string{1: "slow", 2: "echo", 3: "slow", 4: "error unimplemented"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for id, v := range want {
		if got[id] != v {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// TestFullCloseCancelsHandlers: a client that closes its socket entirely
// (not a half-close) is gone: its handlers' contexts end at once instead of
// running to completion for nobody.
func TestFullCloseCancelsHandlers(t *testing.T) {
	s := echoServer()
	var started, canceled atomic.Int32
	s.HandleRaw("block", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		started.Add(1)
		select {
		case <-ctx.Done():
			canceled.Add(1)
		case <-time.After(30 * time.Second):
		}
		return nil, ctx.Err()
	})
	addr := startServer(t, s)
	for _, half := range []bool{false, true} {
		started.Store(0)
		canceled.Store(0)
		c, _ := rawPeer(t, addr)
		w := frame.NewWriter(c)
		h := frame.Header{Type: frame.TypeRequest, ID: 7}
		if err := w.WriteFrame(&h, frame.AppendRequestHead(nil, "block"), nil); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, `started.Load() == 1`, func() bool { return started.Load() == 1 })
		if half {
			// Half-closed and then gone: the handler ends once the peer
			// closes its reading side too.
			halfClose(t, c)
			time.Sleep(100 * time.Millisecond)
			if canceled.Load() != 0 {
				t.Fatal("handler canceled on a half-close; only a full close means the caller is gone")
			}
		}
		c.Close()
		testutil.WaitFor(t, `canceled.Load() == 1`, func() bool { return canceled.Load() == 1 })
	}
}

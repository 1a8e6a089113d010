package rpc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/uds"
)

type slowEchoReq struct {
	I  int `json:"i"`
	MS int `json:"ms"`
}

func ndjsonServer() *Server {
	s := NewServer(ServerOptions{})
	HandleJSON(s, "getService", func(ctx context.Context, r getServiceReq) (serviceAddr, error) {
		if r.Service == "" {
			return serviceAddr{}, Errorf(InvalidArgument, "service is required")
		}
		return serviceAddr{Host: "1.2.3.4", Port: 8765}, nil
	})
	HandleJSON(s, "slowEcho", func(ctx context.Context, r slowEchoReq) (slowEchoReq, error) {
		time.Sleep(time.Duration(r.MS) * time.Millisecond)
		return r, nil
	})
	s.HandleRaw("notJSON", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, "\x00binary"...), nil
	})
	return s
}

// TestNodeNDJSONClient runs the seed-002-style Node client fixture, unmodified,
// against the server that also serves udskit clients on the same socket.
func TestNodeNDJSONClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	s := ndjsonServer()
	addr := startServer(t, s)
	// A udskit client on the same listener at the same time.
	c := dial(t, addr)
	var got serviceAddr
	if err := c.Call(context.Background(), "getService", getServiceReq{Service: "x"}, &got); err != nil || got.Port != 8765 {
		t.Fatalf("udskit client on the shared listener: %+v %v", got, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := strings.TrimPrefix(addr, "unix:")
	out, err := exec.CommandContext(ctx, node, "testdata/ndjson_client.js", path).CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		`{"call":"getService","data":{"host":"1.2.3.4","port":8765}}`,
		`{"call":"noSuchFunc","error":"unknown method \"noSuchFunc\""}`,
		`{"call":"getService-empty","error":"service is required"}`,
		`{"call":"slowEcho","ok":true,"n":200}`,
		`{"done":true}`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("node client printed:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
}

// TestNDJSONWire checks the exact response lines with a plain socket.
func TestNDJSONWire(t *testing.T) {
	addr := startServer(t, ndjsonServer())
	conn, err := uds.Dial(context.Background(), addr, uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	roundTrip := func(line string) string {
		t.Helper()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(resp, "\n")
	}
	cases := []struct{ in, want string }{
		{`{"id":1,"func":"getService","data":{"service":"barista"}}`, `{"id":1,"data":{"host":"1.2.3.4","port":8765}}`},
		{`{"id":"abc","func":"getService","data":{"service":"b"}}`, `{"id":"abc","data":{"host":"1.2.3.4","port":8765}}`},
		{`{"id":2,"func":"nope"}`, `{"id":2,"error":"unknown method \"nope\"","code":"unimplemented"}`},
		{`{"id":3,"func":"notJSON"}`, `{"id":3,"error":"method \"notJSON\" returned 7 bytes that are not JSON; NDJSON clients need JSON","code":"internal"}`},
		{`garbage`, `{"id":null,"error":"bad_request: invalid character 'g' looking for beginning of value","code":"invalid_argument"}`},
		{`{"id":4,"func":"getService","data":{"service":"c"}}`, `{"id":4,"data":{"host":"1.2.3.4","port":8765}}`},
		{`{"id":5,"func":"getService","data":{"service":`, `{"id":5,"error":"bad_request: unexpected end of JSON input","code":"invalid_argument"}`},
	}
	for _, tc := range cases {
		if got := roundTrip(tc.in); got != tc.want {
			t.Errorf("%s\n got  %s\n want %s", tc.in, got, tc.want)
		}
	}
}

// TestNDJSONSlotWaitIsNotAStalledLine: a pipelining NDJSON client whose
// calls fill MaxInFlight waits for a slot; that wait is the server's own
// backpressure and must not be taken for a line that stalled (FrameTimeout).
func TestNDJSONSlotWaitIsNotAStalledLine(t *testing.T) {
	s := NewServer(ServerOptions{FrameTimeout: 100 * time.Millisecond, MaxInFlight: 1})
	HandleJSON(s, "slowEcho", func(ctx context.Context, r slowEchoReq) (slowEchoReq, error) {
		time.Sleep(time.Duration(r.MS) * time.Millisecond)
		return r, nil
	})
	conn, err := uds.Dial(context.Background(), startServer(t, s), uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	lines := `{"id":1,"func":"slowEcho","data":{"i":1,"ms":500}}` + "\n" +
		`{"id":2,"func":"slowEcho","data":{"i":2,"ms":1}}` + "\n" +
		`{"id":3,"func":"slowEcho","data":{"i":3,"ms":1}}` + "\n"
	if _, err := conn.Write([]byte(lines)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i := 1; i <= 3; i++ {
		got, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reply %d: %v (the server closed the connection)", i, err)
		}
		ms := 1
		if i == 1 {
			ms = 500
		}
		if want := fmt.Sprintf(`{"id":%d,"data":{"i":%d,"ms":%d}}`+"\n", i, i, ms); got != want {
			t.Fatalf("reply %d: %q, want %q", i, got, want)
		}
	}
}

// TestNDJSONOneReadObeysTheLimits: 2,000 short lines in one write (one read
// of the reader's buffer holds many of them) to a handler that blocks until
// released start no more calls than MaxInFlight, or than the server's total
// has room for (3 KiB a call); the rest wait, unread, for a slot or for room
// (the Node server took every line of a read at once, refusing those past
// MaxInFlight), and all are answered, each with its data, once released.
func TestNDJSONOneReadObeysTheLimits(t *testing.T) {
	t.Run("MaxInFlight", func(t *testing.T) {
		ndjsonBurst(t, ServerOptions{MaxInFlight: 16}, 2000, 16, 16)
	})
	t.Run("MaxServerBytes", func(t *testing.T) {
		// 1 MiB: about 340 calls of 3 KiB (and their bytes); one more line may be let in
		// per check, as between frames.
		ndjsonBurst(t, ServerOptions{MaxServerBytes: 1 << 20}, 2000, 300, 342)
	})
}

// ndjsonBurst writes n lines at once to a server with opts whose handler
// blocks until released: at least least calls start, then no more than most,
// and every line is answered once they are released.
func ndjsonBurst(t *testing.T, opts ServerOptions, n, least, most int32) {
	var started, running, peak atomic.Int32
	release := make(chan struct{})
	s := NewServer(opts)
	HandleJSON(s, "b", func(ctx context.Context, x int) (int, error) {
		started.Add(1)
		r := running.Add(1)
		for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
		}
		defer running.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return x, nil
	})
	conn, err := uds.Dial(context.Background(), startServer(t, s), uds.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var burst strings.Builder
	for i := 1; i <= int(n); i++ {
		fmt.Fprintf(&burst, `{"id":%d,"func":"b","data":%d}`+"\n", i, i)
	}
	if _, err := conn.Write([]byte(burst.String())); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for started.Load() < least && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // room for any line past the limit to start
	if got := started.Load(); got < least || got > most {
		t.Fatalf("%d calls started while all blocked, want %d to %d", got, least, most)
	}
	t.Logf("%d calls started", started.Load())
	close(release)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	seen := make(map[int]bool, n)
	for range n {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		var r struct {
			ID    int    `json:"id"`
			Data  int    `json:"data"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(line, &r); err != nil || r.Error != "" || r.Data != r.ID || seen[r.ID] {
			t.Fatalf("answer %q (%v)", line, err)
		}
		seen[r.ID] = true
	}
	if p := peak.Load(); p > most {
		t.Fatalf("%d calls ran at once, want at most %d", p, most)
	}
}

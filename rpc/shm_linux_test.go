package rpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/shm"
)

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// TestShmEcho: sizes around the threshold and up to the max frame, each
// answer checked byte for byte; large ones went through the region (stats
// on both sides), small ones did not, and every slot came back.
func TestShmEcho(t *testing.T) {
	s := echoServer()
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for i := 0; i < 4; i++ {
			if err := send(pattern(len(req), i)); err != nil {
				return err
			}
		}
		return nil
	})
	addr := startServer(t, s)
	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	th := shm.DefaultThreshold
	large := 0
	for i, n := range []int{0, 1, 100, th - 1, th, th + 1, 64 << 10, 1 << 20, 3<<20 + 5, 16 << 20} {
		req := pattern(n, i)
		resp, err := c.CallRaw(ctx, "echo", req, nil)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(resp, req) {
			t.Fatalf("%d bytes: the answer differs", n)
		}
		if n >= th {
			large++
		}
	}
	cs, ss := c.ShmStats(), s.ShmStats()
	if cs.Conns != 1 || ss.Conns != 1 {
		t.Fatalf("shm conns: client %d, server %d, want 1 (%+v %+v)", cs.Conns, ss.Conns, cs, ss)
	}
	if cs.Sent != uint64(large) || ss.Received != uint64(large) || ss.Sent != uint64(large) || cs.Received != uint64(large) {
		t.Fatalf("through the region: client %+v server %+v, want %d each way", cs, ss, large)
	}
	// A server stream's large items come through the region too.
	st, err := c.Stream(ctx, "items", pattern(100<<10, 0))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		item, err := st.RecvRaw()
		if err != nil || !bytes.Equal(item, pattern(100<<10, i)) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if _, err := st.RecvRaw(); err == nil {
		t.Fatal("stream did not end")
	}
	defer func() { t.Logf("client %+v server %+v", c.ShmStats(), s.ShmStats()) }()
	waitFor(t, "every slot released", func() bool {
		cs, ss := c.ShmStats(), s.ShmStats()
		return cs.InUse == 0 && ss.InUse == 0 && ss.Sent == uint64(large+4)
	})
}

// TestShmOff: either side's NoShm keeps the socket path, with the same answers.
func TestShmOff(t *testing.T) {
	for _, tc := range []struct{ client, server bool }{{true, false}, {false, true}} {
		t.Run(fmt.Sprintf("client-off=%v", tc.client), func(t *testing.T) {
			s := NewServer(ServerOptions{NoShm: tc.server})
			s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
			c := dialOpts(t, startServer(t, s), ClientOptions{NoShm: tc.client})
			req := pattern(1<<20, 3)
			resp, err := c.CallRaw(context.Background(), "echo", req, nil)
			if err != nil || !bytes.Equal(resp, req) {
				t.Fatal(err)
			}
			if c.ShmStats().Conns != 0 || s.ShmStats().Conns != 0 {
				t.Fatalf("shared memory in use: %+v %+v", c.ShmStats(), s.ShmStats())
			}
		})
	}
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestShmAllocsPerCall: through the region, a unary call still costs at
// most one allocation, client and server together, at every size, also
// with the server's ShmInPlace.
func TestShmAllocsPerCall(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items at random: allocation counts mean nothing (make test runs this package without -race too)")
	}
	for _, inPlace := range []bool{false, true} {
		t.Run(fmt.Sprintf("ShmInPlace=%v", inPlace), func(t *testing.T) { shmAllocsPerCall(t, inPlace) })
	}
}

func shmAllocsPerCall(t *testing.T, inPlace bool) {
	s := NewServer(ServerOptions{ShmInPlace: inPlace})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	for _, size := range []int{64, shm.DefaultThreshold, 64 << 10, 1 << 20} {
		ctx, cancel := context.WithCancel(context.Background())
		p, dst := pattern(size, 1), make([]byte, 0, size)
		call := func() {
			if _, err := c.CallRaw(ctx, "echo", p, dst[:0]); err != nil {
				t.Fatal(err)
			}
		}
		for range 100 {
			call()
		}
		time.Sleep(150 * time.Millisecond) // at least one look of the background reader
		before := c.ShmStats().Sent
		if n := testing.AllocsPerRun(300, call); n > 1.05 {
			t.Errorf("%.2f allocations per call of %d bytes, client + server; want at most 1", n, size)
		}
		if used := c.ShmStats().Sent > before; used != (size >= shm.DefaultThreshold) {
			t.Errorf("%d bytes: through the region %v", size, used)
		}
		cancel()
	}
}

// TestShmPythonClient: a client written from the spec alone, in Python
// (testdata/shm_client.py, standard library), negotiates, echoes through
// the region with releases both ways, keeps small calls on the socket, and
// gets protocol_violation for a descriptor past the region.
func TestShmPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed (scripts/install-deps.sh installs it):", err)
	}
	for _, inPlace := range []bool{false, true} { // also against ShmInPlace: slots read and answers built in place
		s := NewServer(ServerOptions{ShmInPlace: inPlace})
		s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
		addr := startServer(t, s)
		out, err := exec.Command(py, "testdata/shm_client.py", strings.TrimPrefix(addr, "unix:")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "ok violation") {
			t.Fatalf("python client, ShmInPlace %v: %v\n%s", inPlace, err, out)
		}
		t.Logf("ShmInPlace %v: %s", inPlace, out)
	}
}

// TestShmThroughByteRelay: between a Go client and server, a relay that
// copies bytes (as socat or udskit proxy do) drops the offer's descriptor;
// the server declines, and calls of every size work over the socket.
func TestShmThroughByteRelay(t *testing.T) {
	s := echoServer()
	upstream := startServer(t, s)
	relayPath := filepath.Join(t.TempDir(), "relay.sock")
	ln, err := net.Listen("unix", relayPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", strings.TrimPrefix(upstream, "unix:"))
			if err != nil {
				down.Close()
				return
			}
			t.Cleanup(func() { down.Close(); up.Close() })
			go io.Copy(up, down)
			go io.Copy(down, up)
		}
	}()
	c := dialOpts(t, "unix:"+relayPath, ClientOptions{Conns: 1, LargeConns: 1})
	for _, n := range []int{10, 64 << 10, 1 << 20} {
		req := pattern(n, n)
		resp, err := c.CallRaw(context.Background(), "echo", req, nil)
		if err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("%d bytes through the relay: %v", n, err)
		}
	}
	if c.ShmStats().Conns != 0 || s.ShmStats().Conns != 0 {
		t.Fatalf("shared memory in use through a byte relay: %+v %+v", c.ShmStats(), s.ShmStats())
	}
}

// TestShmBidiItems: a bidirectional call's large answers (stream_data) come
// through the region; its request items stay on the socket (spec 10.4).
func TestShmBidiItems(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRawBidi("echo", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		for {
			it, err := recv()
			if err != nil {
				return nil // request_end
			}
			if err := send(it); err != nil {
				return err
			}
		}
	})
	c := dialOpts(t, startServer(t, s), ClientOptions{Conns: 1, LargeConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Bidi(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		item := pattern(100<<10, i)
		if err := b.SendRaw(item); err != nil {
			t.Fatal(err)
		}
		got, err := b.RecvRaw()
		if err != nil || !bytes.Equal(got, item) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	b.CloseSend()
	if _, err := b.RecvRaw(); err == nil {
		t.Fatal("the call did not end")
	}
	if st := s.ShmStats(); st.Sent != 5 || st.Received != 0 {
		t.Fatalf("server shm %+v: want 5 answers through the region, no request items", st)
	}
	waitFor(t, "the answers' slots released", func() bool { return s.ShmStats().InUse == 0 })
}

package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// mdServer answers "md" with the metadata its handler sees, as sorted
// key=value lines, and counts its calls.
func mdServer(calls *atomic.Int32) *Server {
	s := NewServer(ServerOptions{})
	s.HandleRaw("md", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		calls.Add(1)
		var lines []string
		for k, v := range MetadataFromContext(ctx) {
			lines = append(lines, k+"="+v)
		}
		slices.Sort(lines)
		return append(dst, strings.Join(lines, "\n")...), nil
	})
	return s
}

// TestReservedMetadataRefused: metadata keys starting with ':' belong to the
// protocol (spec 3.1). A call whose metadata has one fails with
// invalid_argument before anything is sent, and the connection stays good.
func TestReservedMetadataRefused(t *testing.T) {
	var calls atomic.Int32
	c := dial(t, startServer(t, mdServer(&calls)))
	ctx := WithMetadata(context.Background(), Metadata{"trace": "x", ":pad": "sneaky"})
	_, err := c.CallRaw(ctx, "md", []byte("hi"), nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != InvalidArgument || !strings.Contains(e.Message, `":pad"`) || !strings.Contains(e.Message, "reserved") {
		t.Fatalf("call with a reserved key: %v, want invalid_argument naming the key", err)
	}
	out, err := c.CallRaw(WithMetadata(context.Background(), Metadata{"trace": "x"}), "md", nil, nil)
	if err != nil || string(out) != "trace=x" {
		t.Fatalf("next call: %q %v", out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1 (the refused call must not be sent)", n)
	}
}

// TestHandlerNeverSeesReservedKeys: a request whose head carries :pad and
// an unknown reserved key reaches the handler with only the application's
// metadata.
func TestHandlerNeverSeesReservedKeys(t *testing.T) {
	var calls atomic.Int32
	c, r := rawPeer(t, startServer(t, mdServer(&calls)))
	head := frame.AppendRequestHead(nil, "md", "a", "1", ":future", "2", "b", "3")
	head = frame.AppendPad(head, 40)
	h := frame.Header{Type: frame.TypeRequest, ID: 1}
	if err := frame.NewWriter(c).WriteFrame(&h, head, nil); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := r.ReadFrame(nil)
	if err != nil || f.Type != frame.TypeResponse || string(f.Payload) != "a=1\nb=3" {
		t.Fatalf("answer %+v %q %v, want the metadata without reserved keys", f.Header, f.Payload, err)
	}
}

// TestLargePayloadsArePadded: the Go client pads a large request, and the
// server a large response, so the payload starts 64-byte aligned in its
// write; neither side's application sees the pad.
func TestLargePayloadsArePadded(t *testing.T) {
	big := bytes.Repeat([]byte("p"), 48<<10)
	t.Run("response", func(t *testing.T) {
		c, r := rawPeer(t, startServer(t, echoServer()))
		h := frame.Header{Type: frame.TypeRequest, ID: 1}
		if err := frame.NewWriter(c).WriteFrame(&h, frame.AppendRequestHead(nil, "echo"), big); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := r.ReadFrame(nil)
		if err != nil || f.Type != frame.TypeResponse || !bytes.Equal(f.Payload, big) {
			t.Fatalf("answer %+v %v", f.Header, err)
		}
		checkPadded(t, f.Head)
	})
	t.Run("request", func(t *testing.T) {
		addr := "unix:" + t.TempDir() + "/raw.sock"
		l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := make(chan error, 1)
		go func() { got <- readOneRequest(l, big) }()
		c := dial(t, addr)
		ctx, cancel := context.WithTimeout(WithMetadata(context.Background(), Metadata{"a": "b"}), 5*time.Second)
		defer cancel()
		c.CallRaw(ctx, "echo", big, nil) // the raw server never answers
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	})
}

// readOneRequest accepts one connection, does the server's hello and checks
// its first request: payload want, head method "echo" with a=b and a pad
// that ends the head on a 64-byte boundary.
func readOneRequest(l net.Listener, want []byte) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := frame.NewReader(c, 0)
	if _, err := r.ReadHello(); err != nil {
		return err
	}
	var hb [frame.HelloSize]byte
	(&frame.Hello{Version: 1, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame, MaxInFlight: 16}).Put(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return err
	}
	f, err := r.ReadFrame(nil)
	if err != nil {
		return err
	}
	m, md, err := frame.ParseRequestHead(f.Head)
	if err != nil || string(m) != "echo" || !bytes.Equal(f.Payload, want) {
		return fmt.Errorf("request %q %v", m, err)
	}
	if (frame.HeaderSize+len(f.Head))%64 != 0 {
		return fmt.Errorf("header + head is %d bytes, not a multiple of 64", frame.HeaderSize+len(f.Head))
	}
	if md := parseMD(md); len(md) != 1 || md["a"] != "b" {
		return fmt.Errorf("application metadata %v, want a=b", md)
	}
	return nil
}

// checkPadded fails unless a response head (metadata only) ends on a 64-byte
// boundary with a :pad entry and holds nothing an application would see.
func checkPadded(t *testing.T, head []byte) {
	t.Helper()
	if (frame.HeaderSize+len(head))%64 != 0 {
		t.Fatalf("header + head is %d bytes, not a multiple of 64", frame.HeaderSize+len(head))
	}
	var keys []string
	frame.RangeMetadata(head, func(k, _ []byte) bool { keys = append(keys, string(k)); return true })
	if len(keys) != 1 || keys[0] != frame.PadKey || len(parseMD(head)) != 0 {
		t.Fatalf("response head keys %q", keys)
	}
}

package rpc

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
)

type callStep struct {
	From       string `json:"from"`
	Type       uint8  `json:"type"`
	TypeName   string `json:"type_name"`
	Flags      uint8  `json:"flags"`
	ID         uint32 `json:"id"`
	Aux        uint32 `json:"aux"`
	HeadHex    string `json:"head_hex"`
	PayloadHex string `json:"payload_hex"`
	Hex        string `json:"hex"`
	HeadAny    bool   `json:"head_any"`
}

type callVectors struct {
	Methods map[string]string `json:"methods"`
	Calls   []struct {
		Name            string     `json:"name"`
		Steps           []callStep `json:"steps"`
		ConnectionError bool       `json:"connection_error"`
	} `json:"calls"`
}

// rawServerConn connects to a server's address and exchanges hellos; it
// returns the conn, a reader past the server's hello, and that hello.
func rawServerConn(t *testing.T, addr string) (net.Conn, *frame.Reader, frame.Hello) {
	t.Helper()
	conn, err := net.Dial("unix", addr[len("unix:"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	var hb [frame.HelloSize]byte
	h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | frame.FeatureClientStream, MaxFrame: frame.DefaultMaxFrame}
	h.Put(hb[:])
	if _, err := conn.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	r := frame.NewReader(conn, 0)
	sh, err := r.ReadHello()
	if err != nil {
		t.Fatal(err)
	}
	return conn, r, sh
}

// TestCallVectors replays protocol/vectors/calls.json against a Go server
// with the methods it lists.
func TestCallVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "vectors", "calls.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v callVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Calls) < 10 || v.Methods["sum"] == "" {
		t.Fatalf("calls.json: %d sequences", len(v.Calls))
	}
	s := sumServer()
	s.HandleRawBidi("hold", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	addr := startServer(t, s)
	for _, tc := range v.Calls {
		t.Run(tc.Name, func(t *testing.T) {
			conn, r, sh := rawServerConn(t, addr)
			if sh.Flags&frame.FeatureClientStream == 0 {
				t.Fatalf("server hello flags %#x lack client_stream", sh.Flags)
			}
			canceled := map[uint32]bool{}
			for i, st := range tc.Steps {
				raw, _ := hex.DecodeString(st.Hex)
				if st.From == "client" {
					if _, err := conn.Write(raw); err != nil {
						t.Fatalf("step %d: write: %v", i, err)
					}
					if st.Type == uint8(frame.TypeCancel) {
						canceled[st.ID] = true
					}
					continue
				}
				for {
					f, err := r.ReadFrame(nil)
					if err != nil {
						t.Fatalf("step %d (%s id %d): %v", i, st.TypeName, st.ID, err)
					}
					if canceled[f.ID] && f.ID != st.ID {
						continue
					}
					if tc.ConnectionError && i == len(tc.Steps)-1 && f.ID != 0 {
						continue // a call's own end may come before the connection error
					}
					if uint8(f.Type) != st.Type || f.Flags != st.Flags || f.ID != st.ID || f.Aux != st.Aux ||
						hex.EncodeToString(f.Payload) != st.PayloadHex ||
						(!st.HeadAny && hex.EncodeToString(f.Head) != st.HeadHex) {
						t.Fatalf("step %d: got %s flags %d id %d aux %d head %q payload %q, want %s flags %d id %d aux %d payload %s",
							i, f.Type, f.Flags, f.ID, f.Aux, f.Head, f.Payload, st.TypeName, st.Flags, st.ID, st.Aux, st.PayloadHex)
					}
					break
				}
			}
			if tc.ConnectionError {
				if _, err := r.ReadFrame(nil); err != io.EOF {
					t.Fatalf("after the connection error: %v, want the server to close", err)
				}
			}
		})
	}
}

// TestBidiEOFIsRequestEnd: a client that shuts down its sending side ends
// the items of every open client-stream call (spec 4.3); the server answers
// them and closes.
func TestBidiEOFIsRequestEnd(t *testing.T) {
	addr := startServer(t, sumServer())
	conn, r, _ := rawServerConn(t, addr)
	var out []byte
	for id := uint32(1); id <= 2; id++ {
		h := frame.Header{Type: frame.TypeRequest, Flags: frame.FlagStream | frame.FlagClientStream, ID: id}
		head := frame.AppendRequestHead(nil, "sum")
		h.HeadLen = uint16(len(head))
		out = append(h.Append(out), head...)
		d := frame.Header{Type: frame.TypeRequestData, ID: id, PayloadLen: 1}
		out = append(d.Append(out), byte('0'+id))
	}
	conn.Write(out)
	conn.(*net.UnixConn).CloseWrite()
	got := map[uint32]string{}
	for {
		f, err := r.ReadFrame(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[f.ID] += f.Type.String() + ":" + string(f.Payload) + " "
	}
	if got[1] != "stream_data:1 stream_end: " || got[2] != "stream_data:2 stream_end: " {
		t.Fatalf("got %v", got)
	}
}

// TestBidiCreditOverrunIsViolation: a client that sends far more request
// items than its credit allows (and the handler takes) is a protocol
// violation: the server closes the connection, holding no more than the
// bound meanwhile.
func TestBidiCreditOverrunIsViolation(t *testing.T) {
	s := NewServer(ServerOptions{})
	s.HandleRawBidi("stuck", func(ctx context.Context, recv func() ([]byte, error), send func([]byte) error) error {
		<-ctx.Done()
		return ctx.Err()
	})
	addr := startServer(t, s)
	conn, r, _ := rawServerConn(t, addr)
	overrunCredit(t, conn, r, 1)
}

// overrunCredit opens client-stream call id on method "stuck" over a raw
// connection and sends 50 MiB of request items against its 1 MiB credit,
// then waits for the server's connection error: ProtocolViolation, "beyond
// the credit".
func overrunCredit(t *testing.T, conn net.Conn, r *frame.Reader, id uint32) {
	t.Helper()
	h := frame.Header{Type: frame.TypeRequest, Flags: frame.FlagStream | frame.FlagClientStream, ID: id}
	head := frame.AppendRequestHead(nil, "stuck")
	h.HeadLen = uint16(len(head))
	conn.Write(append(h.Append(nil), head...))
	item := bytes.Repeat([]byte{1}, 256<<10)
	go func() {
		for range 200 { // 50 MiB against a 1 MiB credit (and the max frame)
			d := frame.Header{Type: frame.TypeRequestData, ID: id, PayloadLen: uint32(len(item))}
			if _, err := conn.Write(append(d.Append(nil), item...)); err != nil {
				return
			}
		}
	}()
	for {
		f, err := r.ReadFrame(nil)
		if err != nil {
			t.Fatalf("the server did not report the overrun: %v", err)
		}
		if f.Type == frame.TypeError && f.ID == 0 {
			if Code(f.Aux) != ProtocolViolation || !bytes.Contains(f.Head, []byte("beyond the credit")) {
				t.Fatalf("connection error %d %q", f.Aux, f.Head)
			}
			return
		}
	}
}

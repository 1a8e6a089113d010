package frame

import (
	"bytes"
	"strings"
	"testing"
)

// writeLog records each Write call. Without writev (not a net.Conn),
// net.Buffers writes a large frame as two calls: what was pending (header,
// head, padding), then the payload.
type writeLog struct {
	bytes.Buffer
	calls []int
}

func (l *writeLog) Write(p []byte) (int, error) {
	l.calls = append(l.calls, len(p))
	return l.Buffer.Write(p)
}

// TestWriterPadsLargePayloads: a request or response with a large payload
// gets a :pad entry that puts its payload on a 64-byte boundary of the write
// that carries it, whatever its head and whatever small frames were queued
// before it; the reader sees the same method, metadata and payload, and an
// application (RangeAppMetadata) never sees the pad.
func TestWriterPadsLargePayloads(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 40<<10)
	for _, typ := range []Type{TypeRequest, TypeResponse} {
		for _, queued := range []int{0, 1, 3} {
			for _, extra := range []int{0, 1, 5, 13, 40, 41, 47, 63, 64, 100} {
				var head []byte
				if typ == TypeRequest {
					head = AppendRequestHead(nil, "echo")
				}
				if extra > 0 {
					head = AppendMD(head, "k", strings.Repeat("v", extra))
				}
				var out writeLog
				w := NewWriter(&out)
				for i := range queued {
					h := Header{Type: TypeResponse, ID: uint32(100 + i)}
					if err := w.QueueFrame(&h, nil, []byte("small")); err != nil {
						t.Fatal(err)
					}
				}
				h := Header{Type: typ, ID: 1}
				if err := w.WriteFrame(&h, head, big); err != nil {
					t.Fatal(err)
				}
				if len(out.calls) != 2 || out.calls[1] != len(big) {
					t.Fatalf("writes %v, want what was pending then the payload", out.calls)
				}
				if out.calls[0]%64 != 0 {
					t.Fatalf("%v, %d queued, head %d: payload starts at %d of its write, not on 64", typ, queued, len(head), out.calls[0])
				}
				r := NewReader(&out.Buffer, 0)
				for range queued {
					if f, err := r.ReadFrame(nil); err != nil || string(f.Payload) != "small" {
						t.Fatalf("queued frame: %v", err)
					}
				}
				f, err := r.ReadFrame(nil)
				if err != nil || !bytes.Equal(f.Payload, big) {
					t.Fatalf("large frame: %v", err)
				}
				md := f.Head
				if typ == TypeRequest {
					m, rest, err := ParseRequestHead(f.Head)
					if err != nil || string(m) != "echo" {
						t.Fatalf("method %q %v", m, err)
					}
					md = rest
				}
				var keys, appKeys []string
				_ = RangeMetadata(md, func(k, _ []byte) bool { keys = append(keys, string(k)); return true })
				_ = RangeAppMetadata(md, func(k, _ []byte) bool { appKeys = append(appKeys, string(k)); return true })
				if len(keys) == 0 || keys[len(keys)-1] != PadKey {
					t.Fatalf("keys on the wire %q, want %s last", keys, PadKey)
				}
				if want := min(extra, 1); len(appKeys) != want || want == 1 && appKeys[0] != "k" {
					t.Fatalf("application keys %q", appKeys)
				}
			}
		}
	}
}

// TestWriterPadsOnlyWhereItMay: small payloads, frame types without a
// metadata head, a head too close to MaxHead for the pad, and Align 0 are
// written as given.
func TestWriterPadsOnlyWhereItMay(t *testing.T) {
	big := make([]byte, DefaultLargePayload)
	full := AppendRequestHead(nil, strings.Repeat("m", MaxHead-2-MinPad+1))
	cases := []struct {
		name    string
		typ     Type
		head    []byte
		payload []byte
		align   int
	}{
		{"small request", TypeRequest, AppendRequestHead(nil, "echo"), make([]byte, DefaultLargePayload-1), 64},
		{"stream data", TypeStreamData, nil, big, 64},
		{"ping", TypePing, nil, big, 64},
		{"error", TypeError, []byte("message"), big, 64},
		{"head near MaxHead", TypeRequest, full, big, 64},
		{"padding off", TypeResponse, nil, big, 0},
	}
	for _, tc := range cases {
		var out bytes.Buffer
		w := NewWriter(&out)
		w.Align = tc.align
		h := Header{Type: tc.typ, ID: 1}
		switch tc.typ {
		case TypePing:
			h.ID = 0
		case TypeError:
			h.Aux = 13
		}
		if err := w.WriteFrame(&h, tc.head, tc.payload); err != nil {
			t.Fatal(err)
		}
		f, err := NewReader(&out, 0).ReadFrame(nil)
		if err != nil || !bytes.Equal(f.Head, tc.head) || len(f.Payload) != len(tc.payload) {
			t.Fatalf("%s: head %d bytes (want %d), payload %d: %v", tc.name, len(f.Head), len(tc.head), len(f.Payload), err)
		}
	}
}

func TestAppendPad(t *testing.T) {
	for _, n := range []int{MinPad, MinPad + 1, 71} {
		b := AppendPad([]byte("x"), n)
		if len(b) != 1+n {
			t.Fatalf("AppendPad(%d) added %d bytes", n, len(b)-1)
		}
		var k, v []byte
		if err := RangeMetadata(b[1:], func(key, val []byte) bool { k, v = key, val; return true }); err != nil {
			t.Fatal(err)
		}
		if string(k) != PadKey || len(v) != n-MinPad || bytes.Count(v, []byte{0}) != len(v) {
			t.Fatalf("entry %q=%x", k, v)
		}
	}
}

func TestHasAppMetadata(t *testing.T) {
	pad := AppendPad(nil, MinPad+9)
	app := AppendMD(nil, "trace", "t-1")
	for _, tc := range []struct {
		name string
		md   []byte
		want bool
	}{
		{"none", nil, false},
		{"pad only", pad, false},
		{"other reserved key only", AppendMD(nil, ":x", "y"), false},
		{"app only", app, true},
		{"app then pad", append(append([]byte(nil), app...), pad...), true},
		{"pad then app", append(append([]byte(nil), pad...), app...), true},
	} {
		if got := HasAppMetadata(tc.md); got != tc.want {
			t.Errorf("%s: HasAppMetadata = %v, want %v", tc.name, got, tc.want)
		}
	}
}

package record

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/udskit/udskit/frame"
)

func TestAnnotatorNamesFramesAcrossChunks(t *testing.T) {
	var b []byte
	b = append(b, "UDSK\x01\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"...)
	head := frame.AppendRequestHead(nil, "getService", "trace", "abc")
	h := frame.Header{Type: frame.TypeRequest, ID: 7, HeadLen: uint16(len(head)), PayloadLen: 5, Aux: 250000}
	b = h.Append(b)
	b = append(append(b, head...), "hello"...)
	msg := "unknown method"
	e := frame.Header{Type: frame.TypeError, ID: 8, HeadLen: uint16(len(msg)), Aux: 12}
	b = append(e.Append(b), msg...)
	// Byte by byte: the notes add up to every frame, each named once.
	var a Annotator
	var notes []string
	for i := range b {
		if n := a.Feed(b[i : i+1]); n != "" {
			notes = append(notes, n)
		}
	}
	all := strings.Join(notes, " | ")
	for _, want := range []string{"hello v1", `request id=7 method="getService" timeout=250000us payload=5`, `error id=8 code=12 unimplemented "unknown method"`} {
		if !strings.Contains(all, want) {
			t.Errorf("notes %q lack %q", all, want)
		}
	}
	if len(notes) != 3 {
		t.Errorf("%d notes, want 3: %q", len(notes), notes)
	}
	// In one chunk: one note naming all three.
	var a2 Annotator
	if n := a2.Feed(b); strings.Count(n, "; ") != 2 {
		t.Errorf("one chunk: %q", n)
	}
}

func TestAnnotatorVectorsAndNDJSON(t *testing.T) {
	var frames struct {
		Valid []frameVector `json:"valid"`
	}
	raw, err := os.ReadFile(repoFile(t, "protocol/vectors/frames.json", "testdata/vectors/frames.json"))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(raw, &frames)
	for _, v := range frames.Valid {
		var a Annotator
		a.Feed([]byte("UDSK\x01\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"))
		fb, _ := hex.DecodeString(v.Hex)
		n := a.Feed(fb)
		if !strings.HasPrefix(n, v.TypeName+" id=") || v.Method != "" && !strings.Contains(n, `"`+v.Method+`"`) {
			t.Errorf("%s: note %q", v.Name, n)
		}
	}
	var a Annotator
	n := a.Feed([]byte("{\"id\":1,\"func\":\"getService\",\"data\":{}}\n{\"id\":1,\"err"))
	if n != `ndjson request id=1 func="getService"` {
		t.Errorf("ndjson note %q", n)
	}
	if n := a.Feed([]byte("or\":\"x\",\"code\":\"unimplemented\"}\n")); n != "ndjson error id=1 code=unimplemented" {
		t.Errorf("ndjson error note %q", n)
	}
	var off Annotator
	if n := off.Feed([]byte("GET / HTTP/1.1\r\n")); n != "" {
		t.Errorf("HTTP annotated as %q", n)
	}
}

// FuzzAnnotator: any bytes, in any chunking, neither panic nor grow the
// annotator past its caps.
func FuzzAnnotator(f *testing.F) {
	f.Add([]byte("UDSK\x01\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x06\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00echo"), uint8(3))
	f.Add([]byte("{\"id\":1,\"func\":\"x\"}\n"), uint8(1))
	f.Add([]byte("UDSK\x01\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\xff\xff"), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		var a Annotator
		n := int(step)%64 + 1
		for i := 0; i < len(b); i += n {
			note := a.Feed(b[i:min(i+n, len(b))])
			if len(note) > 64<<10 {
				t.Fatalf("note of %d bytes", len(note))
			}
			if len(a.head) > frame.MaxHead || len(a.line) > maxNoteLine {
				t.Fatalf("annotator holds %d head / %d line bytes", len(a.head), len(a.line))
			}
		}
	})
}

func TestPortGuesses(t *testing.T) {
	for _, tc := range []struct {
		path string
		port uint16
	}{
		{"/var/run/postgresql/.s.PGSQL.5433", PortPostgres},
		{"/run/redis/redis-server.sock", PortRedis},
		{"/var/run/mysqld/mysqld.sock", PortMySQL},
		{"/var/run/docker.sock", PortHTTP},
		{"/run/app/udskit.sock", UdskitPort},
		{"/run/app/x.sock", 0},
	} {
		if p, _ := GuessPort(tc.path); p != tc.port {
			t.Errorf("GuessPort(%s) = %d, want %d", tc.path, p, tc.port)
		}
	}
	for _, tc := range []struct {
		dir  Dir
		b    string
		port uint16
	}{
		{ClientToServer, "UDSK\x01", UdskitPort},
		{ClientToServer, `{"id":1}`, UdskitPort},
		{ClientToServer, "GET /v1.43/containers/json HTTP/1.1\r\n", PortHTTP},
		{ClientToServer, "*2\r\n$3\r\nGET\r\n", PortRedis},
		{ClientToServer, "\x00\x00\x00\x08\x04\xd2\x16\x2f", PortPostgres},
		{ClientToServer, "\x00\x00\x00\x29\x00\x03\x00\x00user\x00", PortPostgres},
		{ServerToClient, "\x4a\x00\x00\x00\x0a8.0.36\x00", PortMySQL},
		{ClientToServer, "\x00\x01garbage", 0},
	} {
		if p, _ := SniffPort(tc.dir, []byte(tc.b)); p != tc.port {
			t.Errorf("SniffPort(%q) = %d, want %d", tc.b, p, tc.port)
		}
	}
}

// FuzzSniffPort: any first bytes, either way, give a known port or none,
// looking at no more than maxSniff bytes.
func FuzzSniffPort(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x08\x04\xd2\x16\x2f"), false)
	f.Add([]byte("\x4a\x00\x00\x00\x0a8.0"), true)
	f.Fuzz(func(t *testing.T, b []byte, server bool) {
		dir := ClientToServer
		if server {
			dir = ServerToClient
		}
		p, why := SniffPort(dir, b)
		switch p {
		case 0, PortHTTP, PortPostgres, PortRedis, PortMySQL, UdskitPort:
		default:
			t.Fatalf("port %d (%s)", p, why)
		}
		if len(b) > maxSniff {
			if p2, _ := SniffPort(dir, b[:maxSniff]); p2 != p {
				t.Fatal("looked past maxSniff")
			}
		}
	})
}

package frame

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

type frameVectors struct {
	MaxFrame uint32 `json:"max_frame"`
	Valid    []struct {
		Name       string            `json:"name"`
		Hex        string            `json:"hex"`
		Type       uint8             `json:"type"`
		TypeName   string            `json:"type_name"`
		Flags      uint8             `json:"flags"`
		ID         uint32            `json:"id"`
		Aux        uint32            `json:"aux"`
		HeadHex    string            `json:"head_hex"`
		PayloadHex string            `json:"payload_hex"`
		Method     *string           `json:"method"`
		Metadata   [][2]string       `json:"metadata"`
		AppMD      map[string]string `json:"app_metadata"`
		Message    *string           `json:"message"`
		Code       *uint32           `json:"code"`
	} `json:"valid"`
	Invalid []struct {
		Name     string `json:"name"`
		Hex      string `json:"hex"`
		MaxFrame uint32 `json:"max_frame"`
		Error    string `json:"error"`
	} `json:"invalid"`
}

type helloVectors struct {
	Valid []struct {
		Name        string `json:"name"`
		Hex         string `json:"hex"`
		Version     uint8  `json:"version"`
		Flags       uint8  `json:"flags"`
		MaxFrame    uint32 `json:"max_frame"`
		MaxInFlight uint32 `json:"max_in_flight"`
	} `json:"valid"`
	Invalid []struct {
		Name  string `json:"name"`
		Hex   string `json:"hex"`
		Error string `json:"error"`
	} `json:"invalid"`
	Negotiate []struct {
		Name        string `json:"name"`
		Client      string `json:"client"`
		Server      string `json:"server"`
		Version     uint8  `json:"version"`
		MaxFrame    uint32 `json:"max_frame"`
		MaxInFlight uint32 `json:"max_in_flight"`
		Features    uint8  `json:"features"`
	} `json:"negotiate"`
}

func loadJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "protocol", "vectors", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func errName(err error) string {
	var pe *ProtocolError
	if errors.As(err, &pe) {
		return pe.Name
	}
	if err == nil {
		return "<nil>"
	}
	return "not a ProtocolError: " + err.Error()
}

func TestFrameVectors(t *testing.T) {
	var v frameVectors
	loadJSON(t, "frames.json", &v)
	if len(v.Valid) < 10 || len(v.Invalid) < 10 {
		t.Fatalf("too few vectors: %d valid, %d invalid", len(v.Valid), len(v.Invalid))
	}
	for _, tc := range v.Valid {
		t.Run("valid/"+tc.Name, func(t *testing.T) {
			b := unhex(t, tc.Hex)
			for _, via := range []string{"Decode", "Reader"} {
				var f Frame
				var err error
				if via == "Decode" {
					var n int
					f, n, err = Decode(b, v.MaxFrame)
					if err == nil && n != len(b) {
						t.Fatalf("Decode used %d of %d bytes", n, len(b))
					}
				} else {
					r := NewReader(bytes.NewReader(b), 0)
					f, err = r.ReadFrame(nil)
				}
				if err != nil {
					t.Fatalf("%s: %v", via, err)
				}
				if uint8(f.Type) != tc.Type || f.Type.String() != tc.TypeName || f.Flags != tc.Flags || f.ID != tc.ID || f.Aux != tc.Aux {
					t.Fatalf("%s: header %+v, want type %d (%s) flags %d id %d aux %d", via, f.Header, tc.Type, tc.TypeName, tc.Flags, tc.ID, tc.Aux)
				}
				if hex.EncodeToString(f.Head) != tc.HeadHex || hex.EncodeToString(f.Payload) != tc.PayloadHex {
					t.Fatalf("%s: head %x payload %x", via, f.Head, f.Payload)
				}
			}
			f, _, _ := Decode(b, v.MaxFrame)
			if tc.Method != nil {
				m, md, err := ParseRequestHead(f.Head)
				if err != nil || string(m) != *tc.Method {
					t.Fatalf("method %q %v, want %q", m, err, *tc.Method)
				}
				checkMD(t, md, tc.Metadata)
				checkAppMD(t, md, tc.AppMD)
			} else if tc.Metadata != nil {
				checkMD(t, f.Head, tc.Metadata)
				checkAppMD(t, f.Head, tc.AppMD)
			}
			if tc.Message != nil && string(f.Head) != *tc.Message {
				t.Fatalf("message %q want %q", f.Head, *tc.Message)
			}
			if tc.Code != nil && f.Aux != *tc.Code {
				t.Fatalf("code %d want %d", f.Aux, *tc.Code)
			}
			// Re-encoding the decoded frame gives the same bytes.
			var out []byte
			out = f.Header.Append(out)
			out = append(append(out, f.Head...), f.Payload...)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded %x, want %x", out, b)
			}
		})
	}
	for _, tc := range v.Invalid {
		t.Run("invalid/"+tc.Name, func(t *testing.T) {
			b := unhex(t, tc.Hex)
			_, _, err := Decode(b, tc.MaxFrame)
			if got := errName(err); got != tc.Error {
				t.Fatalf("Decode: got %s (%v), want %s", got, err, tc.Error)
			}
			r := NewReader(bytes.NewReader(b), 0)
			r.MaxFrame = tc.MaxFrame
			_, err = r.ReadFrame(nil)
			want := tc.Error
			if len(b) == 0 {
				// Between frames, a clean end of stream is io.EOF, not an error.
				if err == nil || err.Error() != "EOF" {
					t.Fatalf("Reader on empty input: %v, want EOF", err)
				}
				return
			}
			if got := errName(err); got != want {
				t.Fatalf("Reader: got %s (%v), want %s", got, err, want)
			}
		})
	}
}

// checkAppMD checks what an application sees (reserved keys hidden, the last
// of a repeated key wins) against the vector's app_metadata.
func checkAppMD(t *testing.T, md []byte, want map[string]string) {
	t.Helper()
	if want == nil {
		t.Fatal("vector has metadata but no app_metadata")
	}
	got := map[string]string{}
	if err := RangeAppMetadata(md, func(k, v []byte) bool {
		got[string(k)] = string(v)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("app metadata %q, want %q", got, want)
	}
}

func checkMD(t *testing.T, md []byte, want [][2]string) {
	t.Helper()
	var got [][2]string
	if err := RangeMetadata(md, func(k, v []byte) bool {
		got = append(got, [2]string{string(k), string(v)})
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("metadata %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("metadata %q, want %q", got, want)
		}
	}
}

func TestHelloVectors(t *testing.T) {
	var v helloVectors
	loadJSON(t, "hello.json", &v)
	for _, tc := range v.Valid {
		t.Run("valid/"+tc.Name, func(t *testing.T) {
			b := unhex(t, tc.Hex)
			h, err := ParseHello(b)
			if err != nil {
				t.Fatal(err)
			}
			if h.Version != tc.Version || h.Flags != tc.Flags || h.MaxFrame != tc.MaxFrame || h.MaxInFlight != tc.MaxInFlight {
				t.Fatalf("got %+v", h)
			}
			h2, err := NewReader(bytes.NewReader(b), 0).ReadHello()
			if err != nil || h2 != h {
				t.Fatalf("Reader: %+v %v", h2, err)
			}
		})
	}
	for _, tc := range v.Invalid {
		t.Run("invalid/"+tc.Name, func(t *testing.T) {
			b := unhex(t, tc.Hex)
			_, err := ParseHello(b)
			if got := errName(err); got != tc.Error {
				t.Fatalf("got %s (%v), want %s", got, err, tc.Error)
			}
			_, err = NewReader(bytes.NewReader(b), 0).ReadHello()
			if got := errName(err); got != tc.Error {
				t.Fatalf("Reader: got %s (%v), want %s", got, err, tc.Error)
			}
		})
	}
	for _, tc := range v.Negotiate {
		t.Run("negotiate/"+tc.Name, func(t *testing.T) {
			c, err1 := ParseHello(unhex(t, tc.Client))
			s, err2 := ParseHello(unhex(t, tc.Server))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			ver, mf, mi, err := Negotiate(c, s)
			if err != nil || ver != tc.Version || mf != tc.MaxFrame || mi != tc.MaxInFlight {
				t.Fatalf("got %d %d %d %v", ver, mf, mi, err)
			}
			if f := Features(c, s); f != tc.Features {
				t.Fatalf("features %#x, want %#x", f, tc.Features)
			}
		})
	}
}

// FuzzDecode: any input either decodes to a frame that re-encodes to the
// same bytes, or fails with a ProtocolError; nothing panics or over-reads.
func FuzzDecode(f *testing.F) {
	var v frameVectors
	loadJSON(f, "frames.json", &v)
	for _, tc := range v.Valid {
		f.Add(unhex(f, tc.Hex), v.MaxFrame)
	}
	for _, tc := range v.Invalid {
		f.Add(unhex(f, tc.Hex), tc.MaxFrame)
	}
	f.Fuzz(func(t *testing.T, b []byte, maxFrame uint32) {
		fr, n, err := Decode(b, maxFrame)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Name == "" {
				t.Fatalf("not a named ProtocolError: %v", err)
			}
		} else {
			if n > len(b) || fr.PayloadLen > maxFrame || int(fr.HeadLen) > MaxHead {
				t.Fatalf("bad decode: n=%d len=%d %+v", n, len(b), fr.Header)
			}
			out := fr.Header.Append(nil)
			out = append(append(out, fr.Head...), fr.Payload...)
			if !bytes.Equal(out, b[:n]) {
				t.Fatal("re-encode differs")
			}
		}
		// The streaming reader agrees with Decode.
		r := NewReader(bytes.NewReader(b), 0)
		r.MaxFrame = maxFrame
		fr2, err2 := r.ReadFrame(nil)
		if (err == nil) != (err2 == nil) && len(b) > 0 {
			t.Fatalf("Decode err %v, Reader err %v", err, err2)
		}
		if err == nil && err2 == nil && (fr2.Header != fr.Header || !bytes.Equal(fr2.Payload, fr.Payload)) {
			t.Fatal("Reader and Decode disagree")
		}
	})
}

// FuzzHello: ParseHello never panics, and accepted hellos re-encode exactly
// (apart from the ignored reserved bytes).
func FuzzHello(f *testing.F) {
	var v helloVectors
	loadJSON(f, "hello.json", &v)
	for _, tc := range v.Valid {
		f.Add(unhex(f, tc.Hex))
	}
	for _, tc := range v.Invalid {
		f.Add(unhex(f, tc.Hex))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("not a ProtocolError: %v", err)
			}
			return
		}
		var out [HelloSize]byte
		h.Put(out[:])
		b2 := append([]byte(nil), b[:HelloSize]...)
		b2[6], b2[7] = 0, 0
		if !bytes.Equal(out[:], b2) {
			t.Fatalf("re-encoded %x from %x", out, b[:HelloSize])
		}
		if _, _, _, err := Negotiate(h, h); err != nil && h.Version == Version {
			t.Fatal(err)
		}
	})
}

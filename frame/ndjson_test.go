package frame

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type ndVectors struct {
	Requests []struct {
		Name, Line, ID, Func, Data string
	} `json:"requests"`
	Invalid []struct {
		Name, Line, Error, ID string
	} `json:"invalid"`
	Responses []struct {
		Name, ID, Data, Error, Code, Line string
	} `json:"responses"`
}

func loadND(t testing.TB) ndVectors {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "vectors", "ndjson.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v ndVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestNDJSONVectors(t *testing.T) {
	v := loadND(t)
	for _, tc := range v.Requests {
		r, err := ParseNDJSONRequest([]byte(tc.Line))
		if err != nil || string(r.ID) != tc.ID || r.Func != tc.Func || string(r.Data) != tc.Data {
			t.Errorf("%s: got id=%s func=%q data=%s err=%v", tc.Name, r.ID, r.Func, r.Data, err)
		}
	}
	for _, tc := range v.Invalid {
		r, err := ParseNDJSONRequest([]byte(tc.Line))
		if tc.Error != "bad_request" || !errors.Is(err, ErrNDJSON) {
			t.Errorf("%s: got %v, want %s", tc.Name, err, tc.Error)
		}
		id := string(r.ID)
		if id == "" {
			id = "null"
		}
		if id != tc.ID {
			t.Errorf("%s: recovered id %s, want %s", tc.Name, id, tc.ID)
		}
	}
	for _, tc := range v.Responses {
		got := string(AppendNDJSONResponse(nil, []byte(tc.ID), []byte(tc.Data), tc.Error, tc.Code))
		if got != tc.Line {
			t.Errorf("%s: got %q want %q", tc.Name, got, tc.Line)
		}
	}
}

// TestNDJSONErrorMessageBytes: an error message may hold any byte (a
// handler's message); its response line is valid JSON all the same and
// decodes to the message (invalid UTF-8 as U+FFFD, as encoding/json does).
func TestNDJSONErrorMessageBytes(t *testing.T) {
	for _, msg := range []string{"bell\a", "nul\x00", "bad\xff", "del\x7f", "tab\tnl\nquote\"back\\", "<&> é \u2028"} {
		line := AppendNDJSONResponse(nil, []byte("7"), nil, msg, "internal")
		var got struct{ Error, Code string }
		if err := json.Unmarshal(line, &got); err != nil || line[len(line)-1] != '\n' {
			t.Errorf("message %q: line %q is not one JSON line: %v", msg, line, err)
			continue
		}
		if want := strings.ToValidUTF8(msg, "\ufffd"); got.Error != want || got.Code != "internal" {
			t.Errorf("message %q: decoded %q/%q, want %q/internal", msg, got.Error, got.Code, want)
		}
	}
}

// FuzzNDJSON: the parser never panics; accepted requests have a usable id,
// a func, and produce a response line that is valid JSON.
func FuzzNDJSON(f *testing.F) {
	v := loadND(f)
	for _, tc := range v.Requests {
		f.Add([]byte(tc.Line))
	}
	for _, tc := range v.Invalid {
		f.Add([]byte(tc.Line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseNDJSONRequest(line)
		if err != nil {
			if !errors.Is(err, ErrNDJSON) {
				t.Fatalf("error does not wrap ErrNDJSON: %v", err)
			}
			if resp := AppendNDJSONResponse(nil, r.ID, nil, err.Error(), "invalid_argument"); !json.Valid(resp) {
				t.Fatalf("error reply %q (recovered id %q) is not JSON", resp, r.ID)
			}
			return
		}
		if r.Func == "" || len(r.ID) == 0 {
			t.Fatalf("accepted %q without id/func", line)
		}
		for _, resp := range [][]byte{
			AppendNDJSONResponse(nil, r.ID, r.Data, "", ""),
			AppendNDJSONResponse(nil, r.ID, nil, "boom \"x\"\n", "internal"),
			AppendNDJSONResponse(nil, r.ID, nil, string(line), "internal"), // any bytes in a message
		} {
			if !json.Valid(resp) || resp[len(resp)-1] != '\n' {
				t.Fatalf("response %q is not one JSON line", resp)
			}
		}
	})
}

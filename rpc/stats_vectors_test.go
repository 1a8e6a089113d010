package rpc

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/udskit/udskit/frame"
)

// statsVectors is protocol/vectors/stats.json (spec 9.3).
type statsVectors struct {
	RequestHex string   `json:"request_hex"`
	RequestID  uint32   `json:"request_id"`
	ShmFields  []string `json:"shm_fields"`
	Answers    []struct {
		Name    string         `json:"name"`
		Payload string         `json:"payload"`
		Conns   int            `json:"conns"`
		Shm     ShmServerStats `json:"shm"`
	} `json:"answers"`
}

func loadStatsVectors(t *testing.T) statsVectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "protocol", "vectors", "stats.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v statsVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestStatsVectors: each answer of stats.json reads as listed into
// ServerStats, and a Go server answers the vectors' request bytes with every
// field the spec names.
func TestStatsVectors(t *testing.T) {
	v := loadStatsVectors(t)
	for _, a := range v.Answers {
		var got ServerStats
		if err := json.Unmarshal([]byte(a.Payload), &got); err != nil {
			t.Fatalf("%s: %v", a.Name, err)
		}
		if got.Conns != a.Conns || !reflect.DeepEqual(got.Shm, a.Shm) {
			t.Fatalf("%s: read %+v, want conns %d shm %+v", a.Name, got, a.Conns, a.Shm)
		}
	}

	s := NewServer(ServerOptions{})
	conn, r, _ := rawServerConn(t, startServer(t, s))
	req, err := hex.DecodeString(v.RequestHex)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	f, err := r.ReadFrame(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, payload := f.Header, f.Payload
	if h.Type != frame.TypeResponse || h.ID != v.RequestID {
		t.Fatalf("answer: type %d id %d, want a response to id %d (payload %q)", h.Type, h.ID, v.RequestID, payload)
	}
	var ans struct {
		Conns *int                       `json:"conns"`
		Shm   map[string]json.RawMessage `json:"shm"`
	}
	if err := json.Unmarshal(payload, &ans); err != nil || ans.Conns == nil || *ans.Conns < 1 {
		t.Fatalf("answer %q: want an object with conns >= 1 (%v)", payload, err)
	}
	for _, f := range v.ShmFields {
		if _, ok := ans.Shm[f]; !ok {
			t.Fatalf("answer %q lacks shm.%s", payload, f)
		}
	}
}

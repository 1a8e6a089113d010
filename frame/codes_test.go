package frame

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestProtocolErrorNames checks the frame package's error names against
// protocol/codes.json, the one list every language uses.
func TestProtocolErrorNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "codes.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		ProtocolErrors []struct {
			Name string `json:"name"`
		} `json:"protocol_errors"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range v.ProtocolErrors {
		listed[e.Name] = true
	}
	for _, name := range []string{NameTruncated, NameBadMagic, NameBadVersion, NameBadLimits,
		NameFrameTooLarge, NameHeadTooLarge, NameBadID, NameBadCode, NameBadHead} {
		if !listed[name] {
			t.Errorf("frame error %q is missing from protocol/codes.json", name)
		}
		delete(listed, name)
	}
	delete(listed, "bad_request") // NDJSON's, checked in package rpc
	for name := range listed {
		t.Errorf("codes.json lists %q, which package frame does not produce", name)
	}
}

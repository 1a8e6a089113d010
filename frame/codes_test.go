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

// Types beyond this version's (and 0) are not Known and print by number.
func TestTypeKnownAndString(t *testing.T) {
	for typ, want := range map[Type]string{0: "type_0", TypeRequest: "request", TypeStreamCredit: "stream_credit", 11: "type_11", 255: "type_255"} {
		if got := typ.String(); got != want {
			t.Errorf("Type(%d).String() = %q, want %q", uint8(typ), got, want)
		}
		if known := want[:5] != "type_"; typ.Known() != known {
			t.Errorf("Type(%d).Known() = %v", uint8(typ), typ.Known())
		}
	}
}

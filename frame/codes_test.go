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
	for typ, want := range map[Type]string{0: "type_0", TypeRequest: "request", TypeStreamCredit: "stream_credit",
		TypeRequestData: "request_data", TypeRequestEnd: "request_end", TypeRequestCredit: "request_credit", 14: "type_14", 255: "type_255"} {
		if got := typ.String(); got != want {
			t.Errorf("Type(%d).String() = %q, want %q", uint8(typ), got, want)
		}
		if known := want[:5] != "type_"; typ.Known() != known {
			t.Errorf("Type(%d).Known() = %v", uint8(typ), typ.Known())
		}
	}
}

// TestTypeDirection: each known type has the direction of spec.md's frame
// table; unknown types pass both ways (they are skipped, not refused).
func TestTypeDirection(t *testing.T) {
	client := map[Type]bool{TypeRequest: true, TypeCancel: true, TypeStreamCredit: true, TypeRequestData: true, TypeRequestEnd: true, TypePing: true, TypePong: true}
	server := map[Type]bool{TypeResponse: true, TypeError: true, TypeStreamData: true, TypeStreamEnd: true, TypeGoAway: true, TypeRequestCredit: true, TypePing: true, TypePong: true}
	for typ := TypeRequest; typ <= TypeRequestCredit; typ++ {
		if typ.FromClient() != client[typ] || typ.FromServer() != server[typ] {
			t.Errorf("%s: FromClient %v FromServer %v, want %v %v", typ, typ.FromClient(), typ.FromServer(), client[typ], server[typ])
		}
	}
	if !Type(14).FromClient() || !Type(14).FromServer() {
		t.Error("an unknown type must not count as a wrong-direction frame")
	}
}

package rpc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestCodesMatchProtocol checks Go's code table against protocol/codes.json,
// the one definition every language's client reads.
func TestCodesMatchProtocol(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "codes.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Codes []struct {
			Code      uint32 `json:"code"`
			Name      string `json:"name"`
			Retryable bool   `json:"retryable"`
		} `json:"codes"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	seen := map[Code]bool{}
	for _, c := range v.Codes {
		code := Code(c.Code)
		seen[code] = true
		if got := code.String(); got != c.Name {
			t.Errorf("code %d: Go name %q, codes.json %q", c.Code, got, c.Name)
		}
		if got := (&Error{Code: code}).Retryable(); got != c.Retryable {
			t.Errorf("code %d (%s): Go retryable %v, codes.json %v", c.Code, c.Name, got, c.Retryable)
		}
		if back, ok := ParseCode(c.Name); !ok || back != code {
			t.Errorf("ParseCode(%q) = %d, %v; want %d", c.Name, back, ok, c.Code)
		}
	}
	for code := range codeNames {
		if !seen[code] {
			t.Errorf("Go code %d (%s) is missing from protocol/codes.json", code, code)
		}
	}
}

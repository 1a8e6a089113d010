package uds

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// addressVectors is protocol/addresses.json: the address syntax every
// language's client parses identically.
type addressVectors struct {
	MaxLen int               `json:"max_len"`
	Errors map[string]string `json:"errors"`
	Valid  []struct {
		Input     string `json:"input"`
		Kind      string `json:"kind"`
		Name      string `json:"name"`
		Canonical string `json:"canonical"`
		SSH       *struct {
			User string `json:"user"`
			Host string `json:"host"`
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"ssh"`
	} `json:"valid"`
	Invalid []struct {
		Input       string `json:"input"`
		InputRepeat *struct {
			Text  string `json:"text"`
			Count int    `json:"count"`
		} `json:"input_repeat"`
		Error string `json:"error"`
	} `json:"invalid"`
}

func TestAddressVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "addresses.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v addressVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if v.MaxLen != MaxAddrLen {
		t.Errorf("max_len %d, Go's MaxAddrLen %d", v.MaxLen, MaxAddrLen)
	}
	if len(v.Valid) < 10 || len(v.Invalid) < 10 {
		t.Fatalf("too few vectors: %d valid, %d invalid", len(v.Valid), len(v.Invalid))
	}
	for _, tc := range v.Valid {
		a, err := ParseAddr(tc.Input)
		if tc.Kind == "abstract" && runtime.GOOS != "linux" {
			if !errors.Is(err, ErrAbstractUnsupported) {
				t.Errorf("%q: want ErrAbstractUnsupported off Linux, got %v", tc.Input, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.Input, err)
			continue
		}
		if a.Kind.String() != tc.Kind || a.Name != tc.Name || a.String() != tc.Canonical {
			t.Errorf("%q: got %s %q %q, want %s %q %q", tc.Input, a.Kind, a.Name, a.String(), tc.Kind, tc.Name, tc.Canonical)
		}
		if (tc.Kind == "ssh") != (tc.SSH != nil) {
			t.Errorf("%q: an ssh vector needs an ssh field, and only an ssh vector has one", tc.Input)
		} else if tc.SSH != nil {
			want := SSHTarget{User: tc.SSH.User, Host: tc.SSH.Host, Port: tc.SSH.Port, Path: tc.SSH.Path}
			if got := a.SSH(); got != want {
				t.Errorf("%q: SSH() = %+v, want %+v", tc.Input, got, want)
			}
		}
		if b, err := ParseAddr(a.String()); err != nil || b != a {
			t.Errorf("%q: canonical %q does not round-trip: %+v, %v", tc.Input, a.String(), b, err)
		}
	}
	for _, tc := range v.Invalid {
		in := tc.Input
		if tc.InputRepeat != nil {
			in = strings.Repeat(tc.InputRepeat.Text, tc.InputRepeat.Count)
		}
		if _, ok := v.Errors[tc.Error]; !ok {
			t.Errorf("%q: error %q is not in the errors table", in, tc.Error)
		}
		_, err := ParseAddr(in)
		var ae *AddrError
		if !errors.As(err, &ae) || ae.Name != tc.Error {
			t.Errorf("ParseAddr(%q) = %v; want AddrError %q", in, err, tc.Error)
		}
	}
}

// TestListenOnlyAddressVectors checks protocol/addresses.json's listen_only
// forms (systemd:NAME, fd:N).
func TestListenOnlyAddressVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "protocol", "addresses.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		ListenOnly addressVectors `json:"listen_only"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	lo := v.ListenOnly
	if len(lo.Valid) == 0 || len(lo.Invalid) == 0 {
		t.Fatal("no listen_only vectors")
	}
	for _, tc := range lo.Valid {
		a, err := ParseAddr(tc.Input)
		if err != nil || a.Kind.String() != tc.Kind || a.Name != tc.Name || a.String() != tc.Canonical {
			t.Errorf("%q: got %s %q %q (%v), want %s %q %q", tc.Input, a.Kind, a.Name, a.String(), err, tc.Kind, tc.Name, tc.Canonical)
		}
	}
	for _, tc := range lo.Invalid {
		if _, ok := lo.Errors[tc.Error]; !ok {
			t.Errorf("%q: error %q is not in the listen_only errors table", tc.Input, tc.Error)
		}
		_, err := ParseAddr(tc.Input)
		var ae *AddrError
		if !errors.As(err, &ae) || ae.Name != tc.Error {
			t.Errorf("ParseAddr(%q) = %v; want AddrError %q", tc.Input, err, tc.Error)
		}
	}
}

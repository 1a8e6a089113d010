package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func TestDoctorExitCode(t *testing.T) {
	p := filepath.Join(testutil.ShortDir(t, 0o700), "cli.sock")
	_, err := runCLI(t, "doctor", "--sniff-timeout", "50ms", p)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("missing socket: want exit 1, got %v", err)
	}
	testutil.Serve(t, testutil.ListenUnix(t, p), testutil.Hangup)
	out, err := runCLI(t, "doctor", "--json", "--probe", "none", "--sniff-timeout", "50ms", p)
	if err != nil {
		t.Fatalf("healthy: %v\n%s", err, out)
	}
	var r struct {
		Connected bool `json:"connected"`
		Checks    []struct{ ID, Status string }
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || !r.Connected || len(r.Checks) < 8 {
		t.Fatalf("json: %v %s", err, out)
	}
	if _, err := runCLI(t, "doctor", "--probe", "gopher", p); err == nil {
		t.Fatal("bad --probe accepted")
	}
}

func TestTimingJSON(t *testing.T) {
	out, err := runCLI(t, "timing", "--duration", "200ms", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Costs []struct {
			NsPerCall float64 `json:"ns_per_call"`
		} `json:"costs"`
		Verdict struct{ Level string } `json:"verdict"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Costs) == 0 || r.Costs[0].NsPerCall <= 0 || r.Verdict.Level == "" {
		t.Fatalf("%v %s", err, out)
	}
	if _, err := runCLI(t, "timing", "--duration", "1ms"); err == nil {
		t.Fatal("1ms duration accepted")
	}
}

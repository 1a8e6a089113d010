package main

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCallBidiFromStdin: `udskit call ADDR sum` (the demo's bidirectional
// method) sends stdin's lines as items and prints each running total; a
// client-streaming method prints its one response; a JSON argument is the
// only item; bad input is a usage error naming the line.
func TestCallBidiFromStdin(t *testing.T) {
	s := scServe(t, filepath.Join(t.TempDir(), "bidi.sock"))
	if r := scRun(t, "1\n2\n\n4.5\n", "call", s.addr, "sum"); r.code != 0 || r.stdout != "1\n3\n7.5\n" {
		t.Fatalf("sum from stdin: %+v", r)
	}
	if r := scRun(t, "1\n2\n", "call", s.addr, "sum", "--bidi"); r.code != 0 || r.stdout != "1\n3\n" {
		t.Fatalf("sum --bidi: %+v", r)
	}
	var seq strings.Builder
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&seq, "%d\n", i)
	}
	if r := scRun(t, seq.String(), "call", s.addr, "total"); r.code != 0 || r.stdout != "5050\n" {
		t.Fatalf("total from stdin: %+v", r)
	}
	if r := scRun(t, "", "call", s.addr, "sum", "5"); r.code != 0 || r.stdout != "5\n" {
		t.Fatalf("sum with a JSON argument: %+v", r)
	}
	if r := scRun(t, "", "call", s.addr, "sum"); r.code != 0 || r.stdout != "" {
		t.Fatalf("sum with no items: %+v", r)
	}
	if r := scRun(t, "1\nnot json\n3\n", "call", s.addr, "sum"); r.code != 2 || !strings.Contains(r.stderr, "stdin line 2 is not valid JSON") {
		t.Fatalf("a bad line: %+v", r)
	}
	if r := scRun(t, "\"x\"\n", "call", s.addr, "sum"); r.code != 1 || !strings.Contains(r.stderr, "invalid_argument") {
		t.Fatalf("a string item: %+v", r)
	}
	if r := scRun(t, "1\n", "call", s.addr, "echo", "--bidi"); r.code != 1 || !strings.Contains(r.stderr, "is unary") {
		t.Fatalf("--bidi on a unary method: %+v", r)
	}
	if r := scRun(t, "", "call", s.addr, "sum", "--bidi", "--stream"); r.code != 2 {
		t.Fatalf("--bidi --stream: %+v", r)
	}
}

// TestCallBidiInteractive: the responses of a bidi call come out as they
// arrive, while stdin is still open: each line's total is read before the
// next line is written.
func TestCallBidiInteractive(t *testing.T) {
	s := scServe(t, filepath.Join(t.TempDir(), "bidi.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := scCLI(ctx, "call", s.addr, "sum", "--timeout", "50s")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(outp)
	total := 0
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(in, "%d\n", i)
		total += i
		line, err := out.ReadString('\n')
		if err != nil || line != fmt.Sprintf("%d\n", total) {
			t.Fatalf("after item %d: %q %v", i, line, err)
		}
	}
	in.Close()
	if rest, _ := out.ReadString('\n'); rest != "" {
		t.Fatalf("after the end: %q", rest)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as the proxy child: run() re-executes
// os.Executable() with -serve-proxy, which here is this test binary.
func TestMain(m *testing.M) {
	if os.Getenv("PROXYBENCH_TEST_CHILD") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var row = regexp.MustCompile(`(?m)^\| (\S+) \| ([0-9.]+) \(`)

// TestTinyRun runs the whole benchmark for a few hundred milliseconds in both
// main directions with real child processes (udskit proxies and socat when
// installed) and checks that every variant produced a row with a positive
// throughput, that the stream byte counts matched (run fails otherwise), and
// that the target lines are printed.
func TestTinyRun(t *testing.T) {
	t.Setenv("PROXYBENCH_TEST_CHILD", "1")
	_, err := exec.LookPath("socat")
	haveSocat := err == nil
	for _, dir := range []string{"tcp-unix", "unix-tcp"} {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var out, progress bytes.Buffer
			cfg := config{rounds: 2, dur: 50 * time.Millisecond, rts: 200, msg: 64, chunk: 64 << 10,
				socat: "socat", dir: dir, altEnv: []string{"GOMAXPROCS=1"}}
			if err := run(ctx, cfg, &out, &progress); err != nil {
				t.Fatalf("run: %v\n%s%s", err, out.String(), progress.String())
			}
			want := []string{"direct-unix", "direct-tcp", "udskit", "udskit-copy", "udskit-alt"}
			if haveSocat {
				want = append(want, "socat")
			}
			got := map[string]float64{}
			for _, m := range row.FindAllStringSubmatch(out.String(), -1) {
				got[m[1]], _ = strconv.ParseFloat(m[2], 64)
			}
			for _, v := range want {
				if got[v] <= 0 {
					t.Errorf("no row with a positive throughput for %s:\n%s", v, out.String())
				}
			}
			if haveSocat && !strings.Contains(out.String(), "udskit/socat throughput: median") {
				t.Errorf("no udskit/socat ratio line:\n%s", out.String())
			}
			if n := strings.Count(progress.String(), "round "); n != 2*len(want) {
				t.Errorf("%d progress lines, want %d:\n%s", n, 2*len(want), progress.String())
			}
		})
	}
}

func TestBadDir(t *testing.T) {
	err := run(context.Background(), config{rounds: 1, dir: "udp-unix"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "want CLIENT-SERVER") {
		t.Fatalf("err = %v", err)
	}
}

// TestProcCPU: the CPU time read from /proc grows when the process burns CPU,
// and treeCPU counts at least the process itself.
func TestProcCPU(t *testing.T) {
	before, ok := procCPU(os.Getpid())
	if !ok {
		t.Skip("no /proc/PID/stat on this system")
	}
	// Burn CPU until /proc shows 30ms more (10ms ticks), or give up after 10s
	// of wall time, however busy the machine is.
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	var after time.Duration
	for after-before < 30*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stuck at %v (from %v) after 10s of busy loop (%d)", after, before, x)
		}
		for range 1_000_000 {
			x++
		}
		after, _ = procCPU(os.Getpid())
	}
	if tree, ok := treeCPU(os.Getpid()); !ok || tree < after {
		t.Fatalf("treeCPU = %v %v, want at least %v", tree, ok, after)
	}
}

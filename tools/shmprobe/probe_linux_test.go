package main

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain lets runCell start this test binary as its server child.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func quick(n, size int) config {
	return config{n: n, size: size, duration: 150 * time.Millisecond, warmup: 30 * time.Millisecond,
		spin: 20 * time.Microsecond, sockConns: 2, full: true}
}

// TestEveryVariantEchoes: each variant, its server a child process, answers
// 16 callers × 64 KiB (and 3 callers at an odd size) with every answer
// compared byte for byte (drive fails a cell on a wrong answer or on no
// answer at all), CPU is measured on both sides, and the report names every
// row. spin gets a longer cell: under load its spinning threads can stall
// each other for 100 ms and more.
func TestEveryVariantEchoes(t *testing.T) {
	odd := quick(3, 5000)
	odd.full = false
	spin := quick(16, 64<<10)
	spin.duration = time.Second
	for _, tc := range []struct {
		cfg      config
		variants string
	}{
		{quick(16, 64<<10), "sock,futex,futexd,futex/c1/s1,futexd/g0"},
		{odd, "sock,futex,futexd"},
		{spin, "spin"},
	} {
		vs, err := parseVariants(tc.variants)
		if err != nil {
			t.Fatal(err)
		}
		cfg := tc.cfg
		res, err := runAll(cfg, vs, 1, nil)
		if err != nil {
			t.Fatalf("%d × %d: %v", cfg.n, cfg.size, err)
		}
		var cli, srv time.Duration
		for i, v := range vs {
			c := res[i][0]
			if c.calls < 1 || c.elapsed < cfg.duration || c.p50 <= 0 || c.cliCPU < 0 || c.srvCPU < 0 {
				t.Errorf("%d × %d, %s: %d calls in %v, p50 %v, CPU %v + %v", cfg.n, cfg.size, v.name, c.calls, c.elapsed, c.p50, c.cliCPU, c.srvCPU)
			}
			cli += c.cliCPU
			srv += c.srvCPU
		}
		// /proc/PID/stat counts 10 ms ticks: summed over the cells.
		if cli <= 0 || srv <= 0 {
			t.Errorf("%s: CPU not measured (client %v, server %v)", tc.variants, cli, srv)
		}
		var b strings.Builder
		writeReport(&b, cfg, vs, res)
		for _, v := range vs {
			if !strings.Contains(b.String(), "| "+v.name+" |") {
				t.Errorf("report has no row %s:\n%s", v.name, b.String())
			}
		}
	}
}

// TestCorruptAnswersAreCaught: a server that flips one byte in the middle
// of every answer fails every variant's cell with errMismatch.
func TestCorruptAnswersAreCaught(t *testing.T) {
	corruptForTest = true
	defer func() { corruptForTest = false }()
	for _, name := range []string{"raw", "sock", "futex", "futexd", "spin"} {
		v, err := parseVariant(name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = runCell(quick(4, 64<<10), v)
		if !errors.Is(err, errMismatch) {
			t.Errorf("%s with a corrupting server: err %v, want %v", name, err, errMismatch)
		}
	}
}

func TestParseVariant(t *testing.T) {
	v, err := parseVariant("futex/c1/s2")
	if err != nil || v.base != "futex" || v.cprocs != 1 || v.sprocs != 2 {
		t.Errorf("futex/c1/s2: %+v, %v", v, err)
	}
	for _, bad := range []string{"ring", "futex/x1", "spin/c0", "raw/c", "sock/s999", "spin/w5", "raw/g1"} {
		if _, err := parseVariant(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	vs, err := parseVariants("spin,spin")
	if err != nil || len(vs) != 2 || vs[0].name != "raw" || vs[1].name != "spin" {
		t.Errorf("spin,spin: %+v, %v (want raw added first, spin once)", vs, err)
	}
	if got := regionSize(16, 64<<10); got%regionAlign != 0 || got < hdrSize+2*16*(64<<10) {
		t.Errorf("regionSize(16, 64 KiB) = %d", got)
	}
	if s, err := parseSize("64k"); err != nil || s != 64<<10 {
		t.Errorf("64k: %d, %v", s, err)
	}
}

func TestMedianAndRatios(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	vs := []variant{{name: "raw", base: "raw"}, {name: "futex", base: "futex"}}
	res := [][]result{
		{{calls: 100, elapsed: time.Second}, {calls: 200, elapsed: time.Second}},
		{{calls: 300, elapsed: time.Second, cliCPU: 3 * time.Millisecond, srvCPU: 3 * time.Millisecond}, {calls: 200, elapsed: time.Second}},
	}
	s := summarize(vs, res)
	if s[1].ratio != 2 || len(s[1].ratios) != 2 || s[1].ratios[0] != 3 || s[1].ratios[1] != 1 {
		t.Errorf("ratios %+v", s[1])
	}
	if c := res[1][0].cpuPerCall(); c != 20*time.Microsecond {
		t.Errorf("cpu per call %v", c)
	}
	res[0][0].cliCPU, res[0][1].cliCPU = 6*time.Millisecond, 8*time.Millisecond // 60 and 40 µs per call
	res[1][1].srvCPU = 4 * time.Millisecond                                     // 20 µs per call
	if s := summarize(vs, res); s[1].cpuRatio != 2.5 {                          // 60/20 and 40/20
		t.Errorf("cpu ratio %v, want 2.5", s[1].cpuRatio)
	}
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain turns the test binary into the bench server when re-executed by Run.
func TestMain(m *testing.M) {
	if os.Getenv("UDSKIT_BENCH_TEST_SERVER") == "1" {
		os.Exit(ServeMain(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func testConfig(t *testing.T) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		ServerCmd: []string{exe},
		// GORACE: a -race server otherwise sleeps a second at exit.
		ServerEnv: []string{"UDSKIT_BENCH_TEST_SERVER=1", "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")},
		Duration:  80 * time.Millisecond,
		Warmup:    40 * time.Millisecond,
	}
}

func TestRunRawTinyMatrix(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"raw-unix", "raw-tcp"}
	cfg.Sizes = []int{1 << 10, 100 << 10}
	cfg.Conc = []int{1, 3}
	cfg.Repeat = 2
	var prog bytes.Buffer
	cfg.Progress = &prog
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Cells), 2*2*2; got != want {
		t.Fatalf("%d cells, want %d", got, want)
	}
	counts := map[[2]int]int64{}
	var srvCPU float64
	for _, c := range rep.Cells {
		if c.RPS <= 0 || c.P50us <= 0 || c.P99us < c.P50us || c.P999us < c.P99us {
			t.Errorf("cell %+v: implausible numbers", c)
		}
		if c.Repeats != 2 || c.Requests < int64(c.Conc) {
			t.Errorf("cell %s %d c=%d: repeats %d requests %d", c.Transport, c.Size, c.Conc, c.Repeats, c.Requests)
		}
		k := [2]int{c.Size, c.Conc}
		if n, ok := counts[k]; ok && n != c.Requests {
			t.Errorf("size %d conc %d: request counts differ across transports: %d vs %d", c.Size, c.Conc, n, c.Requests)
		}
		counts[k] = c.Requests
		if c.VsRaw <= 0 || c.VsGRPC != 0 {
			t.Errorf("cell %s: vs raw %v, vs grpc %v (no grpc measured)", c.Transport, c.VsRaw, c.VsGRPC)
		}
		srvCPU += c.ServerCPUSec
		// A sample's server allocations are its requests' plus a few of its own (the stats
		// exchange around it, the runtime: 3-25 measured, more under load), and a sample here
		// has as few as 10 requests (calibrated from the warm-up: fewer on a loaded machine).
		// So: half an allocation a request plus 64 a sample. (1 a request failed at load 10
		// with 4.5 and 1.9; a cell of 300 requests still fails at 1 a request.)
		if bound := 0.5 + 64/float64(max(c.Requests, 1)); c.ServerAllocsPerReq > bound {
			t.Errorf("cell %s %d c=%d: %.2f server allocs/req over %d requests a sample (bound %.2f), want ~0 for the raw echo server",
				c.Transport, c.Size, c.Conc, c.ServerAllocsPerReq, c.Requests, bound)
		}
	}
	if srvCPU <= 0 {
		t.Errorf("server CPU over all cells is %v, want > 0 from the server's getrusage", srvCPU)
	}
	checkProgress(t, prog.String(), 8+8*2)

	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	checkTable(t, tab.String(), rep)

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	if len(back.Cells) != len(rep.Cells) || back.System.GoVersion == "" {
		t.Fatalf("JSON round trip lost cells or system info: %d cells", len(back.Cells))
	}

	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	noisy := 0
	for _, c := range rep.Cells {
		if c.Noisy {
			noisy++
		}
	}
	checkSVG(t, svg.Bytes(), len(rep.Cells)*2, noisy*2)
}

// checkTable asserts the table is aligned and has a row per cell.
func checkTable(t *testing.T, s string, rep *Report) {
	t.Helper()
	for _, want := range []string{"kernel", "clocksource", rep.System.GoVersion, "cores", "vs grpc", "vs raw", "p99.9"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	var rows []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) > 0 && (strings.HasPrefix(f[0], "raw-") || f[0] == "transport") {
			rows = append(rows, l)
		}
	}
	if len(rows) != len(rep.Cells)+1 {
		t.Fatalf("table has %d rows, want %d:\n%s", len(rows), len(rep.Cells)+1, s)
	}
	// Right-aligned columns: every row ends its "conc" column at the same offset.
	w := len([]rune(strings.TrimRight(rows[0], " ")))
	for _, r := range rows[1:] {
		if n := len([]rune(strings.TrimRight(r, " "))); n > w+10 || n < w-10 {
			t.Errorf("row width %d vs header %d: not aligned:\n%s\n%s", n, w, rows[0], r)
		}
	}
}

// checkSVG parses the chart as XML and counts bars, the hatching over noisy
// ones, and a value label per bar.
func checkSVG(t *testing.T, b []byte, wantBars, wantHatched int) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	bars, hatched, texts := 0, 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "rect":
				isBar, isHatch := false, false
				for _, a := range se.Attr {
					if a.Name.Local == "height" && a.Value != "14" && a.Value != "100%" {
						isBar = true
					}
					if a.Name.Local == "class" && a.Value == "noisy" {
						isHatch = true
					}
				}
				if isHatch {
					hatched++
				} else if isBar {
					bars++
				}
			case "text":
				texts++
			}
		}
	}
	if bars != wantBars {
		t.Errorf("chart has %d bars, want %d", bars, wantBars)
	}
	if hatched != wantHatched {
		t.Errorf("chart hatches %d bars as noisy, want %d", hatched, wantHatched)
	}
	if texts < 10+wantBars {
		t.Errorf("chart has only %d text labels for %d bars", texts, wantBars)
	}
}

// stallCaller echoes in-process and stalls once, at request stallAt, for stall.
type stallCaller struct {
	n       int
	stallAt int
	stall   time.Duration
}

func (s *stallCaller) Call(_ context.Context, p []byte) ([]byte, error) {
	s.n++
	if s.n == s.stallAt {
		time.Sleep(s.stall)
	}
	return p, nil
}

// TestFixedRateCountsQueueingBehindAStall checks the coordinated-omission
// handling of the measurement loop itself: one 100ms stall in a 1000 req/s
// schedule delays the ~100 requests due during it. Closed loop records one
// slow request; fixed rate records them all, from their intended send times.
func TestFixedRateCountsQueueingBehindAStall(t *testing.T) {
	noStats := func() (Stats, error) { return Stats{}, nil }
	run := func(rate float64) *sample {
		cl := &Client{Callers: []Caller{&stallCaller{stallAt: 20, stall: 100 * time.Millisecond}}, Close: func() error { return nil }}
		s, err := measure(context.Background(), cl, noStats, Payload(16), 300, rate, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closed := run(0)
	fixed := run(1000)
	if closed.n != 300 || fixed.n != 300 {
		t.Fatalf("counts %d, %d; want 300", closed.n, fixed.n)
	}
	if p90 := time.Duration(closed.hist.ValueAtQuantile(90)); p90 > 5*time.Millisecond {
		t.Errorf("closed loop p90 %v: the stall should cost one request only", p90)
	}
	if p90 := time.Duration(fixed.hist.ValueAtQuantile(90)); p90 < 5*time.Millisecond {
		t.Errorf("fixed rate p90 %v: the requests queued behind the 100ms stall were not counted", p90)
	}
	if mx := time.Duration(fixed.hist.Max()); mx < 90*time.Millisecond {
		t.Errorf("fixed rate max %v, want about the 100ms stall", mx)
	}
}

// checkProgress asserts the progress lines count steps 1..total in order and
// that their ETA never rises.
func checkProgress(t *testing.T, out string, total int) {
	t.Helper()
	step, last := 0, time.Duration(-1)
	for _, l := range strings.Split(out, "\n") {
		var k, n int
		if _, err := fmt.Sscanf(l, "step %d/%d", &k, &n); err != nil {
			continue
		}
		if k != step+1 || n != total {
			t.Errorf("progress line %q after step %d of %d", l, step, total)
		}
		step = k
		i := strings.LastIndex(l, "ETA ")
		eta, err := time.ParseDuration(strings.TrimSpace(l[i+4:]))
		if i < 0 || err != nil {
			t.Errorf("progress line %q: no ETA", l)
			continue
		}
		if last >= 0 && eta > last {
			t.Errorf("ETA rose from %s to %s: %q", last, eta, l)
		}
		last = eta
	}
	if step != total {
		t.Errorf("progress reached step %d, want %d:\n%s", step, total, out)
	}
}

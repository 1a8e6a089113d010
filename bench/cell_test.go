package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// recSample is a recorded sample: n requests in elapsed, each taking lat,
// with the given client and server heap allocations and CPU.
func recSample(n int64, elapsed, lat time.Duration, cliMallocs, srvMallocs uint64, cpu time.Duration) *sample {
	h := newHist()
	for range n {
		h.RecordValue(int64(lat))
	}
	return &sample{n: n, elapsed: elapsed, hist: h,
		cli: Stats{Mallocs: cliMallocs, UserNS: int64(cpu)},
		srv: Stats{Mallocs: srvMallocs, SysNS: int64(cpu)}}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// Repeats are summarised by the median (not the mean) with the spread
// (max-min)/median, and a spread over NoisySpread flags the cell and adds a
// note to the table; a steady cell is not flagged.
func TestCellMedianSpreadAndNoisyNote(t *testing.T) {
	cfg := Config{NoisySpread: 0.10, Repeat: 3}
	raw := &Transport{Name: "raw-unix", Family: "raw", Network: "unix"}
	rpc := &Transport{Name: "rpc-unix", Family: "rpc", Network: "unix"}
	// 1000 requests in 100ms, 80ms and 50ms: 10k, 12.5k and 20k req/s.
	noisy := makeCell(cfg, raw, 1024, 1, 1000, []*sample{
		recSample(1000, 100*time.Millisecond, 50*time.Microsecond, 0, 1000, 10*time.Millisecond),
		recSample(1000, 80*time.Millisecond, 50*time.Microsecond, 0, 3000, 30*time.Millisecond),
		recSample(1000, 50*time.Millisecond, 50*time.Microsecond, 0, 2000, 20*time.Millisecond),
	})
	if !near(noisy.RPS, 12500) {
		t.Errorf("req/s %v, want the median 12500 (the mean would be 14167)", noisy.RPS)
	}
	if !near(noisy.RPSMin, 10000) || !near(noisy.RPSMax, 20000) || !near(noisy.Spread, 0.8) || !noisy.Noisy {
		t.Errorf("min %v max %v spread %v noisy %v; want 10000 20000 0.8 true", noisy.RPSMin, noisy.RPSMax, noisy.Spread, noisy.Noisy)
	}
	if !near(noisy.ServerAllocsPerReq, 2) || !near(noisy.ClientCPUSec, 0.02) || !near(noisy.ServerCPUSec, 0.02) {
		t.Errorf("server allocs/req %v (want median 2), cpu %v/%v s (want 0.02)", noisy.ServerAllocsPerReq, noisy.ClientCPUSec, noisy.ServerCPUSec)
	}
	if !near(noisy.CPUusPerReq, 40) {
		t.Errorf("cpu µs/req %v, want 40 (0.04 s over 1000 requests)", noisy.CPUusPerReq)
	}
	// 1000 in 100ms and 103ms and 101ms: spread 3%, steady.
	steady := makeCell(cfg, rpc, 1024, 1, 1000, []*sample{
		recSample(1000, 100*time.Millisecond, 90*time.Microsecond, 2000, 1000, time.Millisecond),
		recSample(1000, 103*time.Millisecond, 90*time.Microsecond, 2000, 1000, time.Millisecond),
		recSample(1000, 101*time.Millisecond, 90*time.Microsecond, 2000, 1000, time.Millisecond),
	})
	if steady.Noisy || steady.Spread > 0.05 || !near(steady.ClientAllocsPerReq, 2) {
		t.Errorf("steady cell: noisy %v spread %v allocs %v", steady.Noisy, steady.Spread, steady.ClientAllocsPerReq)
	}
	if us := steady.P50us; us < 89 || us > 91 {
		t.Errorf("p50 %vµs, want 90", us)
	}
	rep := &Report{Settings: Settings{Repeat: 3, NoisySpread: 0.10}, Cells: []Cell{noisy, steady}}
	rep.finish()
	// Pair by pair: 10000/10000, 9709/12500, 9901/20000; the median of those,
	// not the ratio of the medians (9901/12500).
	if c := rep.Cells[1]; !near(c.VsRaw, 1000/0.103/12500) || !near(c.VsRawMin, 1000/0.101/20000) || !near(c.VsRawMax, 1) {
		t.Errorf("vs raw %v (%v..%v), want %v (%v..1)", c.VsRaw, c.VsRawMin, c.VsRawMax, 1000/0.103/12500, 1000/0.101/20000)
	}
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	var noisyRows, steadyRows int
	for _, l := range strings.Split(tab.String(), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "raw-unix":
			if f[len(f)-1] == "NOISY" && strings.Contains(l, "80%") {
				noisyRows++
			}
		case "rpc-unix":
			if f[len(f)-1] != "NOISY" {
				steadyRows++
			}
		}
	}
	if noisyRows != 1 || steadyRows != 1 {
		t.Errorf("want the raw row flagged NOISY with 80%% spread and the rpc row not:\n%s", tab.String())
	}
	if !strings.Contains(tab.String(), "note: 1 of 2 cells are NOISY") {
		t.Errorf("table lacks the noisy note:\n%s", tab.String())
	}
}

// A machine whose speed drifts between rounds moves both transports of a
// round together: the pairwise ratio stays put even though the medians come
// from different rounds.
func TestPairRatioHoldsWhileSpeedDrifts(t *testing.T) {
	cfg := Config{NoisySpread: 0.10, Repeat: 4}
	raw := &Transport{Name: "raw-unix", Family: "raw", Network: "unix"}
	rpc := &Transport{Name: "rpc-unix", Family: "rpc", Network: "unix"}
	var rs, ps []*sample
	// Round speeds 1x, 2x, 0.5x, 3x; rpc does 0.8x of raw in each round.
	for _, f := range []float64{1, 2, 0.5, 3} {
		rs = append(rs, recSample(1000, time.Duration(float64(100*time.Millisecond)/f), time.Microsecond, 0, 0, 0))
		ps = append(ps, recSample(800, time.Duration(float64(100*time.Millisecond)/f), time.Microsecond, 0, 0, 0))
	}
	rep := &Report{Settings: Settings{Repeat: 4, NoisySpread: 0.10},
		Cells: []Cell{makeCell(cfg, raw, 1024, 1, 1000, rs), makeCell(cfg, rpc, 1024, 1, 1000, ps)}}
	rep.finish()
	c := rep.Cells[1]
	if !near(c.VsRaw, 0.8) || !near(c.VsRawMin, 0.8) || !near(c.VsRawMax, 0.8) {
		t.Errorf("vs raw %v (%v..%v), want 0.8 in every round", c.VsRaw, c.VsRawMin, c.VsRawMax)
	}
	if !c.Noisy {
		t.Errorf("req/s varied 6x between rounds: the cell should still be flagged NOISY")
	}
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "0.80x (0.80-0.80)") {
		t.Errorf("table lacks the ratio with its range:\n%s", tab.String())
	}
}

// The chart's smallest bar is readable: ndjson at 1 MiB (104 req/s) next to
// 120,000 req/s used to start the axis at 100 and draw it 2 px tall.
func TestLogAxisSmallestBarVisible(t *testing.T) {
	ax := newLogAxis([]float64{104, 2400, 120000})
	if f := ax.frac(104); f < 0.1 {
		t.Errorf("smallest bar at %.3f of the panel, want >= 0.1", f)
	}
	if f := ax.frac(120000); f > 0.9 {
		t.Errorf("largest bar at %.3f of the panel: no room for its label", f)
	}
	ticks := ax.ticks()
	if len(ticks) < 3 {
		t.Fatalf("ticks %v: want gridlines to read values by", ticks)
	}
	for _, v := range ticks {
		if f := ax.frac(v); f <= 0 || f >= 1 {
			t.Errorf("tick %v outside the axis (frac %v)", v, f)
		}
	}
}

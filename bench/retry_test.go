package bench

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestWindowSpread(t *testing.T) {
	for _, tc := range []struct {
		rps  []float64
		keep int
		want float64
	}{
		{[]float64{100, 130}, 2, 30.0 / 115},
		{[]float64{50, 100, 110, 90}, 3, 20.0 / 100},    // the first round is out of the window
		{[]float64{100}, 3, 0},                          // one value: no spread
		{[]float64{100, 130, 120, 121}, 2, 1.0 / 120.5}, // quiet at the end
	} {
		if got := windowSpread(tc.rps, tc.keep); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("windowSpread(%v, %d) = %v, want %v", tc.rps, tc.keep, got, tc.want)
		}
	}
}

// TestRetryPolicy: a group measures again while one of its cells is noisy
// over its last keep rounds, within the extra rounds and the time cap.
func TestRetryPolicy(t *testing.T) {
	now := time.Now()
	p := retryPolicy{keep: 2, spread: 0.10, max: 3, until: now.Add(time.Minute)}
	quiet := []float64{100, 105}
	noisy := []float64{100, 130}
	cases := []struct {
		name   string
		p      retryPolicy
		rounds [][]float64
		extra  int
		at     time.Time
		want   bool
	}{
		{"all quiet", p, [][]float64{quiet, {50, 52}}, 0, now, false},
		{"one noisy cell repeats its group", p, [][]float64{quiet, noisy}, 0, now, true},
		{"noisy, extra rounds left", p, [][]float64{{100, 105, 104}, {100, 130, 100}}, 2, now, true},
		{"noisy, no extra round left", p, [][]float64{quiet, noisy}, 3, now, false},
		{"noisy, time cap spent", p, [][]float64{quiet, noisy}, 0, now.Add(time.Minute), false},
		{"quiet after a repeat", p, [][]float64{{100, 105, 104}, {100, 130, 120, 121}}, 1, now, false},
		{"retries off", retryPolicy{keep: 2, spread: 0.10, until: now.Add(time.Minute)}, [][]float64{noisy}, 0, now, false},
		{"one round per cell: no spread", retryPolicy{keep: 1, spread: 0.10, max: 3, until: now.Add(time.Minute)}, [][]float64{noisy}, 0, now, false},
	}
	for _, tc := range cases {
		if got := tc.p.again(tc.rounds, tc.extra, tc.at); got != tc.want {
			t.Errorf("%s: again = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRunRepeatsNoisyCells: a real short run whose noise threshold every
// cell exceeds repeats each group up to NoisyRetries extra rounds, reports
// Repeat rounds per cell, and says so in the summary and the notes; with the
// time cap spent, no group repeats.
func TestRunRepeatsNoisyCells(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"raw-unix", "raw-tcp"}
	cfg.Sizes = []int{1 << 10}
	cfg.Conc = []int{2}
	cfg.Repeat = 2
	cfg.NoisySpread = 1e-12 // every cell is noisy: two timed runs never take the same ns
	cfg.NoisyRetries = 2
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cells {
		if c.ExtraRounds != 2 || c.Repeats != 2 || len(c.RPSRounds) != 2 || !c.Noisy {
			t.Errorf("cell %s: extra %d, repeats %d, rounds %v, noisy %v; want 2 extra, 2 reported, noisy",
				c.Transport, c.ExtraRounds, c.Repeats, c.RPSRounds, c.Noisy)
		}
	}
	sum := rep.Summary()
	if !strings.Contains(sum[2], "repeats: 2 cells, 2 still noisy") {
		t.Errorf("summary does not report the repeats: %q", sum)
	}
	for _, l := range sum {
		if len(l) > CompactWidth {
			t.Errorf("summary line over %d columns: %q", CompactWidth, l)
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "2 of 2 cells took extra rounds (at most 2 of 2 allowed") {
		t.Errorf("notes: %q", rep.Notes)
	}

	cfg.NoisyRetryTime = time.Nanosecond // spent before the first group ends
	rep, err = Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cells {
		if c.ExtraRounds != 0 || c.Repeats != 2 {
			t.Errorf("time cap spent: cell %s took %d extra rounds", c.Transport, c.ExtraRounds)
		}
	}
	if sum := rep.Summary(); !strings.Contains(sum[2], "repeats: 0 cells, 2 still noisy") {
		t.Errorf("summary: %q", sum)
	}
}

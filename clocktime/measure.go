package clocktime

import (
	"context"
	"errors"
	"math/bits"
	"time"

	"github.com/udskit/udskit/internal/stats"
)

// Options configures Run. The zero value measures for one second on the real /sys and /proc.
type Options struct {
	// Duration is the total measuring time: half for the per-clock costs, half
	// for the histogram of successive reads. Default 1s; minimum 100ms.
	Duration time.Duration
	// SysRoot and ProcRoot are where to read clocksource, DMI and cpuinfo.
	// Defaults "/sys" and "/proc".
	SysRoot, ProcRoot string
}

// ClockCost is the cost of one way of reading one clock.
type ClockCost struct {
	// Name is the row label, e.g. "monotonic (vDSO)" or "MONOTONIC_COARSE (syscall)".
	Name string `json:"name"`
	// Path is "vdso" or "syscall".
	Path string `json:"path"`
	// NsPerCall is the median over batches of the mean cost of one call.
	NsPerCall float64 `json:"ns_per_call"`
	// Error is set when the clock could not be read.
	Error string `json:"error,omitempty"`
}

// Bucket counts successive-read deltas below BelowNs (and at or above the previous bucket's bound).
type Bucket struct {
	BelowNs int64   `json:"below_ns"`
	Count   int64   `json:"count"`
	Percent float64 `json:"percent"`
}

// Histogram is pg_test_timing's loop: read CLOCK_MONOTONIC (vDSO path) over
// and over and bucket the difference between successive reads.
type Histogram struct {
	Loops int64 `json:"loops"`
	// NsPerLoop is the mean time per iteration, including the loop's own overhead.
	NsPerLoop float64 `json:"ns_per_loop"`
	// Under1us is the percentage of deltas below 1 µs.
	Under1us float64 `json:"percent_under_1us"`
	// MaxNs is the largest delta seen (preemption, interrupts, VM exits).
	MaxNs int64 `json:"max_ns"`
	// Backwards counts deltas below zero: CLOCK_MONOTONIC must never do that.
	Backwards int64 `json:"backwards"`
	// Buckets are powers of two in ns; empty buckets are left out.
	Buckets []Bucket `json:"buckets"`
}

// Report is the result of Run.
type Report struct {
	Costs     []ClockCost `json:"costs"`
	Histogram Histogram   `json:"histogram"`
	// RealtimeBackwards counts CLOCK_REALTIME steps backwards seen while
	// measuring time.Now (NTP or a manual clock set; allowed, but worth knowing).
	RealtimeBackwards int64   `json:"realtime_backwards"`
	System            System  `json:"system"`
	Input             Input   `json:"input"`
	Verdict           Verdict `json:"verdict"`
}

const batch = 2000

// measure returns the median over batches of ns per call of f(batch), spending about budget.
func measure(ctx context.Context, budget time.Duration, f func(n int)) float64 {
	var per []float64
	end := time.Now().Add(budget)
	for len(per) < 5 || (time.Now().Before(end) && len(per) < 100000) {
		if ctx.Err() != nil && len(per) > 0 {
			break
		}
		t0 := time.Now()
		f(batch)
		per = append(per, float64(time.Since(t0).Nanoseconds())/batch)
	}
	return stats.Median(per)
}

// Run measures the clocks and gives a verdict.
func Run(ctx context.Context, opts Options) (*Report, error) {
	d := opts.Duration
	if d == 0 {
		d = time.Second
	}
	if d < 100*time.Millisecond {
		return nil, errors.New("timing: duration must be at least 100ms")
	}
	sysRoot, procRoot := opts.SysRoot, opts.ProcRoot
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	if procRoot == "" {
		procRoot = "/proc"
	}
	r := &Report{System: ReadSystem(sysRoot, procRoot)}
	clocks := syscallClocks()
	per := d / 2 / time.Duration(2+len(clocks))

	base := time.Now()
	var sink time.Duration
	mono := ClockCost{Name: "monotonic (vDSO, time.Since)", Path: "vdso"}
	mono.NsPerCall = measure(ctx, per, func(n int) {
		for range n {
			sink += time.Since(base)
		}
	})
	var prevWall int64
	now := ClockCost{Name: "realtime+monotonic (vDSO, time.Now)", Path: "vdso"}
	now.NsPerCall = measure(ctx, per, func(n int) {
		for range n {
			w := time.Now().UnixNano()
			if w < prevWall {
				r.RealtimeBackwards++
			}
			prevWall = w
		}
	})
	_ = sink
	r.Costs = append(r.Costs, mono, now)
	var sysMono float64
	for _, c := range clocks {
		cc := ClockCost{Name: c.name + " (syscall)", Path: "syscall"}
		if err := c.read(); err != nil {
			cc.Error = err.Error()
		} else {
			cc.NsPerCall = measure(ctx, per, func(n int) {
				for range n {
					_ = c.read()
				}
			})
		}
		if c.name == "MONOTONIC" {
			sysMono = cc.NsPerCall
		}
		r.Costs = append(r.Costs, cc)
	}
	r.Histogram = histogram(ctx, d/2)
	r.Input = Input{System: r.System, VDSONs: mono.NsPerCall, SyscallNs: sysMono, Backwards: r.Histogram.Backwards}
	r.Verdict = Decide(r.Input)
	return r, nil
}

// histogram runs pg_test_timing's loop for about d.
func histogram(ctx context.Context, d time.Duration) Histogram {
	var h Histogram
	var counts [64]int64
	base := time.Now()
	limit := d.Nanoseconds()
	prev := time.Since(base).Nanoseconds()
	start := prev
	var under1us int64
	for {
		cur := time.Since(base).Nanoseconds()
		delta := cur - prev
		prev = cur
		h.Loops++
		if delta < 0 {
			h.Backwards++
			delta = 0
		}
		if delta < 1000 {
			under1us++
		}
		if delta > h.MaxNs {
			h.MaxNs = delta
		}
		counts[bits.Len64(uint64(delta))]++
		if cur-start >= limit || (h.Loops&0xffff == 0 && ctx.Err() != nil) {
			break
		}
	}
	h.NsPerLoop = float64(prev-start) / float64(h.Loops)
	h.Under1us = 100 * float64(under1us) / float64(h.Loops)
	for i, c := range counts {
		if c == 0 {
			continue
		}
		h.Buckets = append(h.Buckets, Bucket{BelowNs: int64(1) << i, Count: c, Percent: 100 * float64(c) / float64(h.Loops)})
	}
	return h
}

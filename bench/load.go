package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// LoadResult summarizes a quick load run (udskit call -n N -c C).
type LoadResult struct {
	Requests, Errors int64
	Elapsed          time.Duration
	// Latency percentiles in microseconds over successful requests.
	P50us, P90us, P99us, P999us, MaxUS float64
	// FirstErr is the first error seen, if any.
	FirstErr error
}

// Load runs fn n times from c concurrent goroutines (c is capped at n) and
// records each call's latency in an HDR histogram. It stops early when ctx ends.
func Load(ctx context.Context, n, c int, fn func(ctx context.Context) error) LoadResult {
	c = max(1, min(c, n))
	var next, errs atomic.Int64
	var once sync.Once
	var first error
	hs := make([]*histogramT, c)
	for i := range hs {
		hs[i] = newHist()
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func(h *histogramT) {
			defer wg.Done()
			for ctx.Err() == nil && next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := fn(ctx); err != nil {
					errs.Add(1)
					once.Do(func() { first = err })
					continue
				}
				h.RecordValue(int64(time.Since(t0)))
			}
		}(hs[i])
	}
	wg.Wait()
	r := LoadResult{Elapsed: time.Since(start), Errors: errs.Load(), FirstErr: first}
	all := newHist()
	for _, h := range hs {
		all.Merge(h)
	}
	r.Requests = all.TotalCount() + r.Errors
	us := func(q float64) float64 { return float64(all.ValueAtQuantile(q)) / 1e3 }
	r.P50us, r.P90us, r.P99us, r.P999us, r.MaxUS = us(50), us(90), us(99), us(99.9), float64(all.Max())/1e3
	return r
}

// Write prints the summary in a few aligned lines.
func (r LoadResult) Write(w io.Writer) {
	ok := r.Requests - r.Errors
	fmt.Fprintf(w, "requests %d  ok %d  errors %d  in %s  (%s req/s)\n", r.Requests, ok, r.Errors,
		r.Elapsed.Round(time.Millisecond), FormatRate(float64(ok)/r.Elapsed.Seconds()))
	if ok > 0 {
		fmt.Fprintf(w, "latency p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n", FormatLatency(r.P50us), FormatLatency(r.P90us),
			FormatLatency(r.P99us), FormatLatency(r.P999us), FormatLatency(r.MaxUS))
	}
	if r.FirstErr != nil {
		fmt.Fprintf(w, "first error: %v\n", r.FirstErr)
	}
}

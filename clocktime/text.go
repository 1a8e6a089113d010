package clocktime

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText prints the report as `udskit timing` shows it: the cost of one
// read per clock, the histogram of successive reads, the clocksource and VM
// evidence, and the verdict with its fix.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintln(w, "Cost of one clock read:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, c := range r.Costs {
		if c.Error != "" {
			fmt.Fprintf(tw, "  %s\t%s\t\n", c.Name, "error: "+c.Error)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%.1f ns\t\n", c.Name, c.NsPerCall)
	}
	tw.Flush()
	h := r.Histogram
	fmt.Fprintf(w, "\nSuccessive CLOCK_MONOTONIC reads (vDSO): %d loops, %.1f ns per loop including overhead\n", h.Loops, h.NsPerLoop)
	fmt.Fprintf(w, "  %.2f%% of deltas under 1 us; largest %s; backwards steps: %d\n", h.Under1us, time.Duration(h.MaxNs), h.Backwards)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  < ns\tpercent\tcount\t")
	for _, b := range h.Buckets {
		fmt.Fprintf(tw, "  %d\t%.5f\t%d\t\n", b.BelowNs, b.Percent, b.Count)
	}
	tw.Flush()
	if r.RealtimeBackwards > 0 {
		fmt.Fprintf(w, "  CLOCK_REALTIME stepped backwards %d times (NTP or a manual clock change)\n", r.RealtimeBackwards)
	}
	s := r.System
	fmt.Fprintf(w, "\nClocksource: %s (available: %s)\n", orUnknown(s.Clocksource), orUnknown(strings.Join(s.Available, " ")))
	fmt.Fprintf(w, "TSC flags: tsc=%v constant_tsc=%v nonstop_tsc=%v\n", s.TSC, s.ConstantTSC, s.NonstopTSC)
	if s.VM {
		fmt.Fprintf(w, "Virtual machine: yes (%s)\n", s.VMHow)
	} else {
		fmt.Fprintln(w, "Virtual machine: not detected")
	}
	v := r.Verdict
	fmt.Fprintf(w, "\nVerdict: %s\n  What it means: %s\n", v.Summary, v.Meaning)
	if v.Fix != "" {
		fmt.Fprintf(w, "  Fix: %s\n", v.Fix)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

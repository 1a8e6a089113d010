package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/clocktime"
)

func init() {
	register(func() *cobra.Command {
		var d time.Duration
		var asJSON bool
		cmd := &cobra.Command{
			Use:   "timing",
			Short: "Measure clock read cost (like pg_test_timing) and say if it is a problem",
			Long: `Measure what reading the clock costs on this machine and give a verdict.

Rows: "monotonic (vDSO)" is one clock_gettime(CLOCK_MONOTONIC) the way programs
and PostgreSQL do it (through the vDSO, no system call); "realtime+monotonic" is
Go's time.Now (two vDSO reads); the "(syscall)" rows force a real clock_gettime
system call for each clock, including the COARSE ones, for comparison. When the
vDSO row costs about as much as a syscall, the vDSO is falling back to the
kernel: the clocksource cannot be read from user space (hpet, acpi_pm, some VMs).

Then, like pg_test_timing, a histogram of the differences between successive
clock reads, any backwards step, the current and available clocksources, VM
evidence, and a verdict with what it costs (EXPLAIN ANALYZE: 2 clock reads per
row per plan node) and the fix.`,
			Example: `  udskit timing
  udskit timing --duration 3s --json`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if d < 100*time.Millisecond || d > 10*time.Minute {
					return fmt.Errorf("--duration %v: want between 100ms and 10m", d)
				}
				r, err := clocktime.Run(cmd.Context(), clocktime.Options{Duration: d})
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(r)
				}
				printTiming(cmd.OutOrStdout(), r)
				return nil
			},
		}
		cmd.Flags().DurationVar(&d, "duration", time.Second, "total measuring time (half per-clock costs, half histogram)")
		cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (fields documented in docs/timing.md)")
		return cmd
	})
}

func printTiming(w io.Writer, r *clocktime.Report) {
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

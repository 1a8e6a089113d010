package main

import (
	"encoding/json"
	"fmt"
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
					return usage(fmt.Errorf("--duration %v: want between 100ms and 10m", d))
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
				r.WriteText(cmd.OutOrStdout())
				return nil
			},
		}
		cmd.Flags().DurationVar(&d, "duration", time.Second, "total measuring time (half per-clock costs, half histogram)")
		cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (fields documented in docs/timing.md)")
		return cmd
	})
}

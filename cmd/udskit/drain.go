package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/internal/lifecycle"
)

// addDrainFlag gives a long-running command the shared --drain-timeout flag
// (rules in internal/lifecycle, one meaning everywhere). Call checkDrain on
// the value before starting.
func addDrainFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "drain-timeout", lifecycle.DefaultDrainTimeout,
		"on SIGINT/SIGTERM, how long open connections may finish before they are closed")
}

// checkDrain rejects a drain timeout that is not positive (bad usage).
func checkDrain(d time.Duration) error {
	if d <= 0 {
		return usage(fmt.Errorf("--drain-timeout %v: must be positive (a second signal closes at once)", d))
	}
	return nil
}

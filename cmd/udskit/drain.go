package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/service"
)

// addDrainFlag gives a long-running command the shared --drain-timeout flag
// (rules in package service, one meaning everywhere). Call checkDrain on
// the value before starting.
func addDrainFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "drain-timeout", service.DefaultDrainTimeout,
		"on SIGINT/SIGTERM, how long open connections may finish before they are closed")
}

// checkDrain rejects a drain timeout that is not positive (bad usage).
func checkDrain(d time.Duration) error {
	if d <= 0 {
		return usage(fmt.Errorf("--drain-timeout %v: must be positive (a second signal closes at once)", d))
	}
	return nil
}

// drainFlags are serve's and proxy's drain flags: --drain-timeout, --drain,
// --drain-min-grace.
type drainFlags struct {
	timeout  time.Duration
	mode     string
	minGrace time.Duration
}

func (d *drainFlags) add(cmd *cobra.Command) {
	addDrainFlag(cmd, &d.timeout)
	cmd.Flags().StringVar(&d.mode, "drain", "goaway", "what a drain does with clients: goaway (stop accepting, tell clients to go: for a handoff or upgrade) or linger (serve on until every client has disconnected: for a sidecar whose app stops at the same time)")
	cmd.Flags().DurationVar(&d.minGrace, "drain-min-grace", 0, "with --drain linger: serve on at least this long after the signal, even with no client connected")
}

// apply checks the flags (bad usage) and sets the drain options of o.
func (d *drainFlags) apply(o *service.Options) error {
	if err := checkDrain(d.timeout); err != nil {
		return err
	}
	m, err := service.ParseDrainMode(d.mode)
	if err != nil {
		return usage(fmt.Errorf("--drain: %w", err))
	}
	if d.minGrace < 0 {
		return usage(fmt.Errorf("--drain-min-grace %v: cannot be negative", d.minGrace))
	}
	if d.minGrace > 0 && m != service.DrainLinger {
		return usage(fmt.Errorf("--drain-min-grace goes with --drain linger"))
	}
	if d.minGrace >= d.timeout {
		return usage(fmt.Errorf("--drain-min-grace %v: must be shorter than --drain-timeout %v, which ends every drain", d.minGrace, d.timeout))
	}
	o.Drain, o.DrainTimeout, o.MinGrace = m, d.timeout, d.minGrace
	return nil
}

// drainHelp is the --drain paragraph of serve's and proxy's help.
const drainHelp = `--drain linger (for a sidecar in a pod: docs/kubernetes.md) changes the first signal: keep
serving and accepting, send no goaway, and stop once every client has disconnected (but not
before --drain-min-grace) or at --drain-timeout. The default, --drain goaway, is for a
handoff or an upgrade.`

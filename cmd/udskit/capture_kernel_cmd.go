package main

// Standalone `capture` command for kernel mode, until the capture command
// (cmd/udskit/capture.go, interposing mode) lands; then its hook calls
// runKernel and this file goes away.

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/kcapture"
)

func init() { register(newKernelCaptureCmd) }

func newKernelCaptureCmd() *cobra.Command {
	var kf kernelFlags
	var kr kernelRun
	var port uint
	c := &cobra.Command{
		Use:     "capture (--kernel PATH | --pid PID | --all | --check) [-w FILE]",
		Short:   "Record unix-socket traffic into pcapng that Wireshark decodes",
		Long:    kernelHelp,
		Example: kernelExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !kf.active() {
				return usageError(cmd, errors.New("choose --kernel PATH, --pid PID, --all or --check"))
			}
			kr.port = uint16(port)
			kr.stdout, kr.stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runKernel(cmd.Context(), &kf, kr)
		},
	}
	addKernelFlags(c, &kf)
	f := c.Flags()
	f.StringVarP(&kr.out, "write", "w", "", "write pcapng to FILE (- for stdout); default: a text view on stdout")
	f.IntVar(&kr.snaplen, "snaplen", kcapture.DefaultSnaplen, "bytes recorded per syscall; the rest is marked as not captured")
	f.UintVar(&port, "port", 0, "synthetic server port (decides the Wireshark dissector: 5432 pgsql, 6379 redis, 80 http)")
	f.IntVar(&kr.count, "count", 0, "stop after N messages")
	f.DurationVar(&kr.duration, "duration", 0, "stop after this long")
	_ = time.Second
	return c
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/udskit/udskit/kcapture"
	"github.com/udskit/udskit/record"
	"github.com/udskit/udskit/service"
)

// Kernel mode (eBPF) of `udskit capture`: --kernel PATH | --pid PID | --all,
// and --check. capture.go calls addKernelFlags and picks mode "kernel" when
// kernelFlags.active.

func init() { captureModes["kernel"] = runKernelMode }

// kernelFlags are capture's kernel-mode flags.
type kernelFlags struct {
	kernel kernelFlag
	path   string // the socket path selected: --kernel=PATH or --kernel PATH
	pid    int
	all    bool
	check  bool
	// bufMB is --buffer-size: the ring buffer in MB (0: kcapture's default).
	bufMB int
	// bothSides is --both-sides (kcapture.Options.BothSides).
	bothSides bool
}

// kernelFlag is --kernel, with an optional PATH: "--kernel PATH" (PATH is
// then the positional argument), "--kernel=PATH", or "--kernel" beside
// --pid PID or --all, as people type it.
type kernelFlag struct {
	on   bool
	path string
}

// kernelOn is what --kernel without "=PATH" sets.
const kernelOn = "true"

func (k *kernelFlag) String() string { return k.path }

func (k *kernelFlag) Set(s string) error {
	k.on = true
	if s != kernelOn {
		k.path = s
	}
	return nil
}

// Type is "bool" so that --help shows --kernel with no value name: its
// value is optional (NoOptDefVal), and the usage text says [PATH].
func (k *kernelFlag) Type() string { return "bool" }

// kernelHelp is appended to capture's --help.
const kernelHelp = `

Mode 4: kernel (eBPF, root): --kernel PATH, --kernel --pid PID, --kernel --all (--pid
and --all alone work too) record what processes send and receive on unix sockets,
including connections opened BEFORE the capture, with no restart and no interposition:
the sockets bound to PATH and their peers, every unix socket of process PID, or every
unix socket on the host. Both ends' pids, uids and commands are in each connection's
comment; fds passed with SCM_RIGHTS are noted; datagram and seqpacket messages stay one
packet each. --snaplen bounds the bytes kept per syscall (default 64 KiB; the rest is
marked as not captured). When both ends of a connection are selected each byte is
recorded once, when sent. Bytes or events the kernel could not deliver are counted,
reported at the end (with the drop rate) and marked in the file; --buffer-size MiB
enlarges the ring buffer that absorbs bursts. Needs Linux with BTF, root (or
CAP_BPF+CAP_PERFMON) and tracefs (mounted if missing). --check says which capture modes
this machine supports and why.`

const kernelExamples = `

  # Kernel mode: a PostgreSQL session that was already open, both directions:
  sudo udskit capture --kernel /run/postgresql/.s.PGSQL.5432 -w pg.pcapng --duration 30s

  # Every unix socket of one process, live in the terminal:
  sudo udskit capture --kernel --pid 1234

  # Which capture modes work on this machine, and why:
  sudo udskit capture --check`

// addKernelFlags registers the kernel-mode flags.
func addKernelFlags(c *cobra.Command, fl *pflag.FlagSet, kf *kernelFlags) {
	fl.Var(&kf.kernel, "kernel", "kernel mode (eBPF, root), existing connections included: --kernel PATH records the sockets bound to PATH and their peers; --kernel --pid PID and --kernel --all as --pid and --all")
	fl.Lookup("kernel").NoOptDefVal = kernelOn
	fl.IntVar(&kf.pid, "pid", 0, "kernel mode (eBPF, root): record every unix socket of this process")
	fl.BoolVar(&kf.all, "all", false, "kernel mode (eBPF, root): record every unix socket on the host")
	fl.IntVarP(&kf.bufMB, "buffer-size", "B", 0, "kernel mode: the ring buffer between kernel and udskit, in MiB (rounded up to a power of two, at most 256; default 64, or 4 x --snaplen): larger rides out longer bursts")
	fl.BoolVar(&kf.bothSides, "both-sides", false, "kernel mode: record reads even when the sender's writes are recorded (each byte twice in the ring; for senders using splice, sendfile or io_uring, which are not traced)")
	fl.BoolVar(&kf.check, "check", false, "say which capture modes this machine supports, and why, then exit")
	c.Long += kernelHelp
	c.Example += kernelExamples
}

// active reports whether a kernel-mode flag was given.
func (kf *kernelFlags) active() bool {
	return kf.kernel.on || kf.pid != 0 || kf.all || kf.check
}

// validate checks the kernel-mode flags against the positional arguments.
func (kf *kernelFlags) validate(args []string) error {
	if kf.check {
		if len(args) != 0 {
			return errors.New("--check takes no PATH: udskit capture --check")
		}
		return nil
	}
	kf.path = kf.kernel.path
	if kf.kernel.on && kf.path == "" && len(args) == 1 {
		kf.path, args = args[0], nil // --kernel PATH
	}
	if len(args) != 0 {
		return fmt.Errorf("kernel mode records one selection; extra arguments %q: use udskit capture --kernel PATH, --kernel --pid PID or --kernel --all", args)
	}
	if kf.kernel.on && kf.path == "" && kf.pid == 0 && !kf.all {
		return errors.New("--kernel needs what to record: udskit capture --kernel PATH, --kernel --pid PID or --kernel --all")
	}
	if err := (kcapture.Selection{Path: kf.path, PID: kf.pid, All: kf.all}).Validate(); err != nil {
		return errors.New("kernel mode records one selection: use exactly one of --kernel PATH, --pid PID, --all")
	}
	return nil
}

// runCheck prints what this machine supports; exit 1 when kernel capture
// cannot run.
func runCheck(w io.Writer) error {
	fmt.Fprintln(w, "interpose (capture PATH), proxy tap (proxy --capture), in-process (capture.ServerWrap): supported")
	r := kcapture.Check(true)
	if r.OK {
		fmt.Fprintf(w, "kernel (--kernel/--pid/--all): supported: %s\n", r.Method)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
		return nil
	}
	fmt.Fprintln(w, "kernel (--kernel/--pid/--all): NOT supported here:")
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %v\n", p)
	}
	return &exitError{code: 1, err: errors.New("kernel capture is not available on this machine")}
}

// runKernelMode runs a kernel capture into sink until a signal, --duration
// or --count.
func runKernelMode(ctx context.Context, cmd *cobra.Command, f *captureFlags, args []string, sink record.Sink, log *slog.Logger) error {
	kf := &f.kernel
	if kf.check {
		return runCheck(cmd.OutOrStdout())
	}
	note := func(format string, a ...any) {
		if !f.quiet {
			fmt.Fprintf(cmd.ErrOrStderr(), "capture: "+format+"\n", a...)
		}
	}
	sel := kcapture.Selection{Path: kf.path, PID: kf.pid, All: kf.all}
	if kf.bufMB < 0 || kf.bufMB > 256 {
		return usage(fmt.Errorf("--buffer-size %d: want 1 to 256 (MiB)", kf.bufMB))
	}
	c, err := kcapture.Open(kcapture.Options{Select: sel, Snaplen: f.snaplen, RingBytes: kf.bufMB << 20, BothSides: kf.bothSides, Logf: note})
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer c.Close()

	ctx, stop := service.NotifyContext(ctx)
	defer stop()
	note("recording %s from the kernel (existing connections included); Ctrl-C to stop", sel)
	st, err := c.Run(ctx, sink, nil)
	if st != nil {
		note("%s", st)
		if st.Lost() > 0 {
			note("%s", lossAdvice(st, kf.bufMB))
		}
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

// lossAdvice says what was lost in the kernel and how to keep every byte.
func lossAdvice(st *kcapture.Stats, bufMB int) string {
	ring := "the default"
	if bufMB > 0 {
		ring = fmt.Sprintf("%d MiB", bufMB)
	}
	return fmt.Sprintf("WARNING: %d events were lost in the kernel, %.1f%% of the data bytes (counted, and marked in the output): "+
		"the reader fell behind. To keep every byte: a smaller --snaplen (fewer bytes per message), a larger ring "+
		"(--buffer-size MiB, now %s, up to 256), or interposition (udskit capture PATH: it slows the traffic instead of dropping)",
		st.Lost(), st.LossPercent(), ring)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/kcapture"
	"github.com/udskit/udskit/pcapng"
)

// kernelFlags are capture's kernel-mode (eBPF) flags.
type kernelFlags struct {
	path  string
	pid   int
	all   bool
	check bool
}

const kernelHelp = `Kernel mode (eBPF, root): --kernel PATH | --pid PID | --all records what
processes send and receive on existing unix-socket connections too, with no
restart and no interposition: the sockets bound to PATH and their peers, every
unix socket of process PID, or every unix socket on the host. It needs Linux
with BTF, root (or CAP_BPF+CAP_PERFMON) and tracefs (mounted if missing).
--check says which capture modes this machine supports and why.`

const kernelExamples = `  # Everything psql and PostgreSQL say on the server's socket, including
  # sessions that were open before the capture started:
  sudo udskit capture --kernel /run/postgresql/.s.PGSQL.5432 -w pg.pcapng --duration 30s
  tshark -r pg.pcapng -Y pgsql.query -T fields -e pgsql.query

  # One process's unix-socket traffic, live in the terminal:
  sudo udskit capture --pid 1234

  # What can this machine do?
  sudo udskit capture --check`

// addKernelFlags registers the kernel-mode flags on the capture command.
func addKernelFlags(c *cobra.Command, kf *kernelFlags) {
	f := c.Flags()
	f.StringVar(&kf.path, "kernel", "", "kernel mode (eBPF): record the sockets bound to this path and their peers, including existing connections")
	f.IntVar(&kf.pid, "pid", 0, "kernel mode (eBPF): record every unix socket of this process")
	f.BoolVar(&kf.all, "all", false, "kernel mode (eBPF): record every unix socket on the host")
	f.BoolVar(&kf.check, "check", false, "say which capture modes this machine supports, and why, then exit")
}

// active reports whether a kernel-mode flag was given.
func (kf *kernelFlags) active() bool {
	return kf.path != "" || kf.pid != 0 || kf.all || kf.check
}

// kernelRun is what a kernel capture needs from the capture command's
// common flags.
type kernelRun struct {
	out      string // -w: file, "-" for stdout, "" for a text view on stdout
	snaplen  int
	port     uint16
	count    int
	duration time.Duration
	stdout   io.Writer
	stderr   io.Writer
	// portFor chooses the server port when port is 0 (nil: the writer's default).
	portFor kcapture.PortFunc
}

// runCheck prints what this machine supports.
func runCheck(w io.Writer) error {
	fmt.Fprintln(w, "interpose (capture PATH), proxy tap, in-process: supported (no privilege needed beyond access to the socket)")
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

// runKernel runs a kernel capture until a signal, --duration or --count.
func runKernel(ctx context.Context, kf *kernelFlags, kr kernelRun) error {
	if kf.check {
		return runCheck(kr.stdout)
	}
	sel := kcapture.Selection{Path: kf.path, PID: kf.pid, All: kf.all}
	if err := sel.Validate(); err != nil {
		return &exitError{code: 2, err: errors.New("use exactly one of --kernel PATH, --pid PID, --all")}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(kr.stderr, format+"\n", args...) }
	c, err := kcapture.Open(kcapture.Options{Select: sel, Snaplen: kr.snaplen, Logf: logf})
	if err != nil {
		return err
	}
	defer c.Close()

	var sink kcapture.Sink
	var w *pcapng.Writer
	switch kr.out {
	case "":
		sink = &kcapture.TextSink{W: kr.stdout}
	default:
		var out io.Writer = kr.stdout
		if kr.out != "-" {
			f, err := os.OpenFile(kr.out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
			if err != nil {
				return err
			}
			defer f.Close()
			out = f
		}
		w, err = pcapng.NewWriter(out, pcapng.Options{Snaplen: pcapng.MaxSegment})
		if err != nil {
			return err
		}
		ps := &kcapture.PcapngSink{W: w, Port: kr.portFor, OnOpen: func(info *kcapture.ConnInfo, port uint16, why string) {
			if why == "" {
				why = "default"
			}
			logf("connection: %s; server port %d (%s)", info.Comment(), port, why)
		}}
		if kr.port != 0 {
			port := kr.port
			ps.Port = func(*kcapture.ConnInfo) (uint16, string) { return port, "--port" }
		}
		sink = ps
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if kr.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, kr.duration)
		defer cancel()
	}
	if kr.count > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		sink = &countSink{Sink: sink, left: kr.count, done: cancel}
	}
	logf("capturing %s (Ctrl-C to stop)", sel)
	st, err := c.Run(ctx, sink, nil)
	if w != nil {
		if cerr := w.Close(); err == nil {
			err = cerr
		}
	}
	if st != nil {
		logf("kernel capture: %s", st)
		if st.Lost() > 0 {
			logf("WARNING: %d events were lost in the kernel (marked in the capture); a larger --snaplen needs a larger ring buffer, and a slow output (-w on a slow disk) makes the ring buffer overflow", st.Lost())
		}
	}
	return err
}

// countSink cancels the capture after count messages.
type countSink struct {
	kcapture.Sink
	left int
	done context.CancelFunc
}

func (s *countSink) OpenConn(info kcapture.ConnInfo, t time.Time) (kcapture.ConnSink, error) {
	cs, err := s.Sink.OpenConn(info, t)
	if err != nil {
		return nil, err
	}
	return &countConn{ConnSink: cs, s: s}, nil
}

type countConn struct {
	kcapture.ConnSink
	s *countSink
}

func (c *countConn) Data(dir kcapture.Dir, t time.Time, p []byte, note string) error {
	if c.s.left <= 0 {
		return nil
	}
	c.s.left--
	if c.s.left == 0 {
		c.s.done()
	}
	return c.ConnSink.Data(dir, t, p, note)
}

//go:build linux

// Command kcapture measures what kernel capture (eBPF) costs the processes
// it watches: a 64-byte ping-pong between two processes over a unix socket,
// with no capture, with a capture attached to another process (--pid of an
// idle process), and with a capture attached to the ping-pong itself. The
// three are interleaved (off, other, self, off, ...), each sample a fixed
// number of round trips, and the medians compared.
//
//	sudo go run ./tools/benchkcapture [-rounds 7] [-n 50000] [-size 64] [-attach raw|tracepoints] [-tight] [-floor]
//
// Needs what kernel capture needs (Linux, root, BTF).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	procfs "github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/internal/stats"
	"github.com/udskit/udskit/kcapture"
	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/record"
)

const roleEnv = "KCAPTURE_BENCH_ROLE"

// attachMode is kcapture.Options.Attach (-attach).
var attachMode string

// floorMode is -floor.
var floorMode *bool

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		if err := child(role, os.Args[1]); err != nil {
			fmt.Fprintln(os.Stderr, role+":", err)
			os.Exit(1)
		}
		return
	}
	rounds := flag.Int("rounds", 7, "samples per mode (interleaved)")
	n := flag.Int("n", 50000, "round trips per sample")
	size := flag.Int("size", 64, "message size in bytes")
	attachFlag := flag.String("attach", "", "attach point: \"\" (auto: raw tracepoints on x86-64), raw, tracepoints")
	tight := flag.Bool("tight", false, "instead of the ping-pong, write+read through a socketpair inside the client process (the per-syscall cost alone, without scheduling noise)")
	floorMode = flag.Bool("floor", false, "add a mode with do-nothing BPF programs on the raw sys_enter/sys_exit tracepoints: the cost any syscall-tracepoint capture pays")
	flag.Parse()
	attachMode = *attachFlag
	if err := run(*rounds, *n, *size, *tight); err != nil {
		fmt.Fprintln(os.Stderr, "kcapture bench:", err)
		os.Exit(1)
	}
}

// child runs one side of the ping-pong (or the idle process).
func child(role, path string) error {
	switch role {
	case "server":
		// Blocking syscalls on raw fds: two syscalls per round trip per
		// process, as in a C ping-pong, without the Go poller's extra ones.
		lfd, err := unixSocket(path, true)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		fd, _, err := syscall.Accept(lfd)
		if err != nil {
			return err
		}
		buf := make([]byte, 64<<10)
		for {
			k, err := syscall.Read(fd, buf)
			if err != nil || k == 0 {
				return nil
			}
			if _, err := syscall.Write(fd, buf[:k]); err != nil {
				return nil
			}
		}
	case "client":
		fd, err := unixSocket(path, false)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			var n, size int
			var tight bool
			fmt.Sscan(in.Text(), &n, &size, &tight)
			msg, buf := make([]byte, size), make([]byte, size)
			cpu0 := cpuNanos()
			if tight {
				ns, err := tightLoop(n, msg, buf)
				if err != nil {
					return err
				}
				fmt.Println(ns, cpuNanos()-cpu0)
				continue
			}
			start := time.Now()
			for range n {
				if _, err := syscall.Write(fd, msg); err != nil {
					return err
				}
				for got := 0; got < size; {
					k, err := syscall.Read(fd, buf[got:])
					if err != nil || k == 0 {
						return fmt.Errorf("read: %v", err)
					}
					got += k
				}
			}
			fmt.Println(time.Since(start).Nanoseconds(), cpuNanos()-cpu0)
		}
		return nil
	case "idle":
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return nil
	}
	return fmt.Errorf("unknown role %q", role)
}

// unixSocket returns a blocking stream socket listening on (listen) or
// connected to path.
func unixSocket(path string, listen bool) (int, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	sa := &syscall.SockaddrUnix{Name: path}
	if listen {
		if err := syscall.Bind(fd, sa); err != nil {
			return -1, err
		}
		return fd, syscall.Listen(fd, 1)
	}
	return fd, syscall.Connect(fd, sa)
}

// tightLoop writes and reads size bytes through a socketpair in this one
// process n times: no scheduling, so it shows the per-syscall cost alone.
func tightLoop(n int, msg, buf []byte) (int64, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	start := time.Now()
	for range n {
		if _, err := syscall.Write(fds[0], msg); err != nil {
			return 0, err
		}
		if _, err := syscall.Read(fds[1], buf); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Nanoseconds(), nil
}

// cpuNanos is this process's user+system CPU time.
func cpuNanos() int64 {
	u, s := procfs.SelfCPU()
	return int64(u + s)
}

type proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func start(role, path string) (*proc, error) {
	cmd := exec.Command(os.Args[0], path)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if l, err := p.out.ReadString('\n'); err != nil || l != "ready\n" {
		return nil, fmt.Errorf("%s did not start: %q %v", role, l, err)
	}
	return p, nil
}

func (p *proc) stop() { p.in.Close(); p.cmd.Process.Kill(); p.cmd.Wait() }

// attach attaches a kernel capture to pid, writing pcapng to nowhere.
func attach(pid int) (stop func() (*kcapture.Stats, error), err error) {
	c, err := kcapture.Open(kcapture.Options{Select: kcapture.Selection{PID: pid}, Attach: attachMode})
	if err != nil {
		return nil, err
	}
	w, _ := pcapng.NewWriter(io.Discard, pcapng.Options{Snaplen: pcapng.MaxSegment})
	ctx, cancel := context.WithCancel(context.Background())
	type res struct {
		st  *kcapture.Stats
		err error
	}
	done := make(chan res, 1)
	go func() {
		st, err := c.Run(ctx, record.NewPcapSink(w, record.PcapOptions{}), nil)
		done <- res{st, err}
	}()
	return func() (*kcapture.Stats, error) {
		cancel()
		r := <-done
		c.Close()
		return r.st, r.err
	}, nil
}

func run(rounds, n, size int, tight bool) error {
	dir, err := os.MkdirTemp("", "kcapture-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "pp.sock")
	srv, err := start("server", path)
	if err != nil {
		return err
	}
	defer srv.stop()
	cli, err := start("client", path)
	if err != nil {
		return err
	}
	defer cli.stop()
	idle, err := start("idle", path)
	if err != nil {
		return err
	}
	defer idle.stop()

	cpu := make([][]float64, 4)
	cur := 0
	sample := func() (float64, error) {
		fmt.Fprintf(cli.in, "%d %d %v\n", n, size, tight)
		l, err := cli.out.ReadString('\n')
		if err != nil {
			return 0, err
		}
		var ns, cpuns int64
		if _, err := fmt.Sscan(l, &ns, &cpuns); err != nil {
			return 0, err
		}
		cpu[cur] = append(cpu[cur], float64(cpuns)/float64(n)/1e3)
		return float64(ns) / float64(n) / 1e3, nil // µs per round trip
	}
	modes := []struct {
		name  string
		pid   int
		empty bool // no capture: do-nothing programs on the raw syscall tracepoints
	}{{"off", 0, false}, {"capture on another process", idle.cmd.Process.Pid, false},
		{"capture on the ping-pong client", cli.cmd.Process.Pid, false}}
	if *floorMode {
		modes = append(modes, struct {
			name  string
			pid   int
			empty bool
		}{"empty programs (kernel floor)", 0, true})
	}
	res := make([][]float64, len(modes))
	if _, err := sample(); err != nil { // warm-up
		return err
	}
	cpu[0] = nil
	for r := range rounds {
		for i, m := range modes {
			var stop func() (*kcapture.Stats, error)
			if m.empty {
				detach, err := attachEmpty()
				if err != nil {
					return err
				}
				stop = func() (*kcapture.Stats, error) { detach(); return nil, nil }
			}
			if m.pid != 0 {
				if stop, err = attach(m.pid); err != nil {
					return err
				}
			}
			cur = i
			us, err := sample()
			if err != nil {
				return err
			}
			if stop != nil {
				st, err := stop()
				if err != nil {
					return err
				}
				if r == 0 && st != nil {
					fmt.Printf("  (%s: %s)\n", m.name, st)
				}
			}
			res[i] = append(res[i], us)
		}
	}
	what := "ping-pong between two processes"
	if tight {
		what = "write+read through a socketpair in one process (µs per write+read)"
	}
	fmt.Printf("%d-byte %s, %d round trips per sample, %d interleaved samples per mode\n", size, what, n, rounds)
	base := stats.Median(res[0])
	for i, m := range modes {
		med := stats.Median(res[i])
		// Each round's sample against the same round's "off" sample: noise
		// that lasts longer than a round cancels out.
		ratios := make([]float64, len(res[i]))
		for r := range res[i] {
			ratios[r] = res[i][r] / res[0][r]
		}
		fmt.Printf("%-32s median %6.2f µs/round trip  %5.3fx off (paired per round: %5.3fx)  samples %s\n", m.name, med, med/base, stats.Median(ratios), fmtSamples(res[i]))
	}
	fmt.Println("CPU time of the client process (user+system) per round trip, same samples:")
	for i, m := range modes {
		med := stats.Median(cpu[i])
		fmt.Printf("%-32s median %6.2f µs  %5.3fx off\n", m.name, med, med/stats.Median(cpu[0]))
	}
	return nil
}

func fmtSamples(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}

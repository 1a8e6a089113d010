package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/uds"
)

// Stats are a process's own runtime counters, as reported by the server over
// its control socket and read locally for the client.
type Stats struct {
	Mallocs uint64 `json:"mallocs"`
	// UserNS and SysNS are CPU time from getrusage(RUSAGE_SELF), in ns.
	UserNS int64 `json:"user_ns"`
	SysNS  int64 `json:"sys_ns"`
}

// CPU is user+system CPU time.
func (s Stats) CPU() time.Duration { return time.Duration(s.UserNS + s.SysNS) }

// ReadStats reads this process's counters. It stops the world briefly
// (runtime.ReadMemStats), so call it only outside measured windows.
func ReadStats() Stats {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u, s := proc.SelfCPU()
	return Stats{Mallocs: ms.Mallocs, UserNS: u.Nanoseconds(), SysNS: s.Nanoseconds()}
}

// maxCtlLine caps one control-socket line in either direction.
const maxCtlLine = 4096

// readLine reads one '\n'-terminated line of at most max bytes (without the newline).
func readLine(r *bufio.Reader, max int) (string, error) {
	var sb strings.Builder
	for {
		frag, err := r.ReadSlice('\n')
		if sb.Len()+len(frag) > max+1 {
			return "", fmt.Errorf("control line over %d bytes", max)
		}
		sb.Write(frag)
		if err == nil {
			return strings.TrimRight(sb.String(), "\r\n"), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return "", err
		}
	}
}

// ParseStats decodes a stats reply line.
func ParseStats(line string) (Stats, error) {
	if len(line) > maxCtlLine {
		return Stats{}, fmt.Errorf("stats reply over %d bytes", maxCtlLine)
	}
	var s Stats
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Stats{}, fmt.Errorf("bad stats reply: %w", err)
	}
	if s.UserNS < 0 || s.SysNS < 0 {
		return Stats{}, errors.New("bad stats reply: negative CPU time")
	}
	return s, nil
}

// serveCtl answers "stats" lines on the control listener with this process's Stats.
func serveCtl(ctx context.Context, ln net.Listener, log *slog.Logger) {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			r := bufio.NewReaderSize(c, 512)
			for {
				line, err := readLine(r, maxCtlLine)
				if err != nil {
					return
				}
				switch line {
				case "stats":
					b, _ := json.Marshal(ReadStats())
					if _, err := c.Write(append(b, '\n')); err != nil {
						return
					}
				default:
					log.Warn("bench control: unknown request", "line", line)
					fmt.Fprintf(c, "{\"error\":%q}\n", "unknown request")
					return
				}
			}
		}()
	}
}

// ServeMain is the benchmark server process: `udskit bench-server` calls it
// with its arguments, and tests call it from TestMain. Flags:
//
//	--transport NAME  one registered transport
//	--addr ADDR       where to listen (udskit address syntax; tcp port 0 picks one)
//	--ctl PATH        unix socket for the stats control channel
//
// Once both sockets listen it prints "READY <data-addr> <ctl-path>" on stdout.
// It exits when stdin reaches EOF (the parent is gone), or on SIGTERM/SIGINT.
func ServeMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("transport", "", "transport to serve")
	addr := fs.String("addr", "", "listen address")
	ctl := fs.String("ctl", "", "control socket path")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	t, ok := Lookup(*name)
	if !ok {
		fmt.Fprintln(stderr, "bench-server:", &UnknownTransportError{Name: *name})
		return 2
	}
	if *addr == "" || *ctl == "" {
		fmt.Fprintln(stderr, "bench-server: --addr and --ctl are required")
		return 2
	}
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer cancel()
	ln, err := uds.Listen(ctx, *addr, uds.ListenOptions{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "bench-server:", err)
		return 1
	}
	defer ln.Close()
	cln, err := uds.Listen(ctx, *ctl, uds.ListenOptions{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "bench-server:", err)
		return 1
	}
	defer cln.Close()
	go serveCtl(ctx, cln, log)
	if stdin != nil {
		go func() {
			io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	dataAddr := ln.Addr().String()
	if ln.Addr().Network() == "tcp" {
		dataAddr = "tcp:" + dataAddr
	} else {
		dataAddr = *addr
	}
	fmt.Fprintf(stdout, "READY %s %s\n", dataAddr, *ctl)
	if err := t.Serve(ctx, ln); err != nil && ctx.Err() == nil {
		fmt.Fprintln(stderr, "bench-server:", err)
		return 1
	}
	return 0
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/record"
	"github.com/udskit/udskit/service"
	"github.com/udskit/udskit/uds"
)

func init() {
	register(newCaptureCmd)
}

// captureFlags are the flags every capture mode shares.
type captureFlags struct {
	write    string
	port     uint16
	count    int
	duration time.Duration
	snaplen  int
	rotateMB int
	files    int
	hex      bool
	drain    time.Duration
	anyCli   bool
	restore  bool
	quiet    bool
	drop     bool
	kernel   kernelFlags // capture_kernel.go
}

// captureModes maps a mode to its runner. Mode "interpose" is the
// positional PATH; more modes (an eBPF --kernel mode) add an entry and a
// flag that selects it in pickCaptureMode.
var captureModes = map[string]func(ctx context.Context, cmd *cobra.Command, f *captureFlags, args []string, sink capture.Sink, log *slog.Logger) error{
	"interpose": runInterpose,
}

func pickCaptureMode(f *captureFlags, args []string) (string, error) {
	if f.kernel.active() {
		return "kernel", f.kernel.validate(args)
	}
	if len(args) != 1 {
		return "", errors.New("give the socket PATH to capture")
	}
	return "interpose", nil
}

func newCaptureCmd() *cobra.Command {
	f := &captureFlags{}
	cmd := &cobra.Command{
		Use:   "capture {PATH | --kernel PATH | --kernel --pid PID | --kernel --all | --restore PATH | --check} [-w FILE|-] [flags]",
		Short: "tcpdump for unix sockets: record a live socket's traffic as pcapng Wireshark decodes",
		Long: `Record the traffic of a unix socket, live, without restarting its server: a text
view in the terminal, or pcapng that Wireshark and tshark decode.

The three commands people run (Ctrl-C stops; the socket is put back as it was):

  sudo udskit capture /run/app.sock                       # look: live text view
  sudo udskit capture /run/app.sock -w app.pcapng         # record for Wireshark (-w - to pipe)
  sudo udskit capture --kernel --pid 1234 -w app.pcapng   # open connections too (eBPF)

The first two interpose on the socket path (mode 1: new connections only, any Linux); the
third reads from the kernel (mode 4: connections already open, root and BTF).
--duration and --count (messages, like tcpdump -c, in every mode) end a capture on their
own. Details of each mode follow.

Mode 1 (capture PATH): interpose on a live socket path.
  - The server's socket file is hard-linked aside (PATH` + capture.AsideSuffix + `), a relay socket
    with the same mode and owner is renamed over PATH (atomic: PATH always answers), and every
    NEW connection is relayed to the real server and recorded. Connections opened before the
    capture keep working but are not seen (mode 4 sees them).
  - On exit (Ctrl-C, SIGTERM, --duration, --count) the original is renamed back (same inode);
    open relayed connections get --drain-timeout to finish, a second signal cuts them
    (docs/stopping.md).
  - Run as root, the relay connects with each client's own uid/gid/groups, so the server's
    SO_PEERCRED checks still see the client (the pid it sees is the relay's).
  - Killed (SIGKILL)? The next capture of PATH, or 'udskit capture --restore PATH', puts the
    original back; 'udskit doctor PATH' explains the leftover state.
  - Refused: datagram sockets, abstract names (@name: relay them under a new name with
    mode 2), directories you cannot write.

Mode 2: tap a proxy: 'udskit proxy --listen A --to B --capture FILE' records what the
proxy relays (the copy path is used instead of splice while capturing).

Mode 3: inside a udskit program: rpc.ServerOptions.WrapConn / rpc.ClientOptions.WrapConn
with capture.ServerWrap / capture.ClientWrap record the program's own connections,
with decoded call ids and methods as packet comments (docs/capture.md).`,
		Example: `  # A quick look at what goes over a socket (Ctrl-C to stop and restore):
  sudo udskit capture /var/run/docker.sock

  # PostgreSQL queries into Wireshark's PostgreSQL dissector:
  sudo udskit capture /var/run/postgresql/.s.PGSQL.5432 -w pg.pcapng --duration 30s
  tshark -r pg.pcapng -Y pgsql.query -T fields -e pgsql.query

  # Live into Wireshark or tshark:
  sudo udskit capture /run/redis/redis.sock -w - | wireshark -k -i -
  sudo udskit capture /run/redis/redis.sock -w - | tshark -r - -Y resp

  # A long capture that cannot fill the disk: 100 MB files, keep the newest 10:
  sudo udskit capture /run/app.sock -w app.pcapng -C 100 -W 10

  # Put the socket back after a capture was killed:
  sudo udskit capture --restore /run/app.sock

  # udskit traffic decoded by the bundled dissector:
  udskit capture ./app.sock -w - | tshark -X lua_script:wireshark/udskit.lua -r - -Y udskit`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.restore {
				if len(args) != 1 {
					return usage(errors.New("--restore needs the socket PATH"))
				}
				return runRestore(cmd, args[0])
			}
			mode, err := pickCaptureMode(f, args)
			if err != nil {
				return usage(err)
			}
			if f.count < 0 || f.duration < 0 || f.snaplen < 0 || f.rotateMB < 0 || f.files < 0 {
				return usage(errors.New("--count, --duration, --snaplen, -C and -W cannot be negative"))
			}
			if f.files > 0 && f.rotateMB == 0 {
				return usage(errors.New("-W needs -C (the file size to rotate at)"))
			}
			if f.rotateMB > 0 && f.write == "" {
				return usage(errors.New("-C needs -w FILE"))
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			note := func(format string, a ...any) {
				if !f.quiet {
					fmt.Fprintf(cmd.ErrOrStderr(), "capture: "+format+"\n", a...)
				}
			}
			var sink record.Sink
			if f.write != "" {
				w, closeOut, err := record.CreatePcap(f.write, record.OutputOptions{Snaplen: f.snaplen,
					RotateBytes: int64(f.rotateMB) * 1_000_000, MaxFiles: f.files, Drop: f.drop, Stdout: cmd.OutOrStdout()})
				if err != nil {
					if errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist) {
						return &exitError{code: 1, err: err}
					}
					return usage(err)
				}
				defer func() {
					if err := closeOut(); err != nil {
						note("closing %s: %v", f.write, err)
					}
					note("%d packets written to %s", w.Packets(), f.write)
					if d := w.PayloadDropped(); d > 0 {
						note("%d payload bytes were left out (packets kept with their headers): the file could not keep up (--drop)", d)
					}
				}()
				sink = record.NewPcapSink(w, record.PcapOptions{Port: f.port, OnPort: func(socket string, port uint16, why string) {
					note("%s: server port %d: %s", socket, port, why)
				}})
			} else {
				bw := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
				sink = record.NewTextSink(bw, record.TextOptions{Hex: f.hex, Snaplen: f.snaplen})
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if f.duration > 0 {
				ctx, cancel = context.WithTimeout(ctx, f.duration)
				defer cancel()
			}
			// --count: the same in every mode (record.Limit): stop after
			// this many data messages, as tcpdump -c stops after packets.
			sink = record.Limit(sink, f.count, cancel)
			return captureModes[mode](ctx, cmd, f, args, sink, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.write, "write", "w", "", "write pcapng to FILE (- for stdout, flushed per packet); without it, print a live text view")
	fl.Uint16Var(&f.port, "port", 0, "server TCP port to show (picks the Wireshark dissector); default: sniffed from the first bytes or guessed from the socket name")
	fl.IntVarP(&f.count, "count", "c", 0, "stop after recording this many messages, in every mode (like tcpdump -c; a message is one relayed read or one syscall's data; 0: no limit)")
	fl.DurationVar(&f.duration, "duration", 0, "stop after this long (0: until Ctrl-C/SIGTERM)")
	fl.IntVarP(&f.snaplen, "snaplen", "s", 0, "keep at most this many bytes of each packet's payload (0: all; the text view prints 4096)")
	fl.IntVarP(&f.rotateMB, "file-size", "C", 0, "with -w FILE: start a new file (FILE.1, FILE.2, ...) when the current one reaches this many MB (1,000,000 bytes)")
	fl.IntVarP(&f.files, "files", "W", 0, "with -C: keep only the newest N files")
	fl.BoolVarP(&f.hex, "hex", "X", false, "text view: hex and ASCII (like tcpdump -X) instead of printable text (-A)")
	addDrainFlag(cmd, &f.drain)
	fl.BoolVar(&f.anyCli, "any-client", false, "when not root, also relay clients of other uids (the server then sees your uid, not theirs)")
	fl.BoolVar(&f.drop, "drop", false, "with -w FILE: when the disk cannot keep up, leave payloads out (packets keep their headers; counted and reported, like tcpdump's drops) instead of slowing the relayed traffic")
	fl.BoolVar(&f.restore, "restore", false, "put back the original socket a killed capture of PATH left aside, and exit")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no notes on stderr")
	addKernelFlags(cmd, fl, &f.kernel)
	cmd.Long += captureOutputHelp
	fl.SortFlags = false
	return cmd
}

// captureOutputHelp ends capture's --help, after every mode.
const captureOutputHelp = `

Output: with -w FILE (or -w - for stdout, flushed per packet), pcapng where each
connection is a synthetic TCP flow over 127.0.0.1 with a server port chosen so that
Wireshark's own dissectors apply: --port, or sniffed from the first bytes, or guessed
from the socket name (PostgreSQL .s.PGSQL.* 5432, Redis 6379, HTTP 80, MySQL 3306,
udskit 7377 with wireshark/udskit.lua). One interface per socket, named by its path;
each connection's first packet carries a comment with the client's pid, uid, gid and
command and the server's pid. Without -w, a readable live view (like tcpdump -A; -X
for hex). --count N stops after N recorded messages in every mode (a message is one
relayed read, or one syscall's data in kernel mode; opens and closes do not count).`

// runInterpose is mode 1: interpose on a live socket path.
func runInterpose(ctx context.Context, cmd *cobra.Command, f *captureFlags, args []string, sink capture.Sink, log *slog.Logger) error {
	path := args[0]
	if a, err := parseAddr(path); err != nil {
		return err
	} else if a.Kind == uds.TCP {
		return usage(fmt.Errorf("%s is a TCP address; capture takes a unix socket path", path))
	}
	var ip *capture.Interposer
	_, err := service.Run(ctx, service.Options{Name: "capture", DrainTimeout: f.drain, Logger: log,
		Status: func() []any {
			st := ip.Stats()
			return []any{"open", st.Active, "relayed", st.Ended}
		}},
		func(ctx context.Context, _ []*handoff.Listener) (service.Service, error) {
			var err error
			ip, err = capture.Interpose(ctx, path, capture.InterposeOptions{Sink: sink, Drain: f.drain, AnyClient: f.anyCli, Logger: log})
			if err != nil {
				return nil, err
			}
			if !f.quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "capture: interposed on %s (original aside at %s); new connections are relayed and recorded, connections opened earlier are not seen; Ctrl-C to stop and restore\n",
					ip.Path(), ip.Path()+capture.AsideSuffix)
			}
			return service.Adapt(ip), nil
		})
	if ip != nil && !f.quiet {
		st := ip.Stats()
		fmt.Fprintf(cmd.ErrOrStderr(), "capture: original socket restored at %s; %d connections relayed, %d failed to reach the server, %d refused\n",
			ip.Path(), st.Ended, st.Failed, st.Refused)
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

func runRestore(cmd *cobra.Command, path string) error {
	what, err := capture.Restore(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(cmd.OutOrStdout(), "nothing to restore: no %s%s beside %s\n", path, capture.AsideSuffix, path)
			return nil
		}
		return &exitError{code: 1, err: err}
	}
	fmt.Fprintln(cmd.OutOrStdout(), what)
	return nil
}

// proxyCapture sets up udskit proxy --capture FILE: a pcapng sink tapped
// into the proxy. The returned func closes the output.
func proxyCapture(opts *proxy.Options, file string, log *slog.Logger) (func(), error) {
	w, closeOut, err := record.CreatePcap(file, record.OutputOptions{})
	if err != nil {
		return nil, err
	}
	opts.Tap = capture.ProxyTap(record.NewPcapSink(w, record.PcapOptions{OnPort: func(socket string, port uint16, why string) {
		log.Info("capture", "socket", socket, "server_port", port, "why", why)
	}}))
	return func() {
		if err := closeOut(); err != nil {
			log.Error("capture file", "file", file, "err", err)
		}
		log.Info("capture written", "file", file, "packets", w.Packets())
	}, nil
}

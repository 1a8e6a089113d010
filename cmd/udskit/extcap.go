package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/extcap"
	"github.com/udskit/udskit/service"
)

func init() { register(newExtcapCmd) }

// extcapFlags are Wireshark's extcap arguments, the capture options the
// udskit interface offers, and --install.
type extcapFlags struct {
	interfaces, dlts, config, capture bool
	version, iface, reload, fifo      string
	filter                            string
	controlIn, controlOut, debugFile  string
	debug                             bool
	opts                              extcap.CaptureOptions
	port                              uint16
	install, uninstall                bool
	dir, tshark                       string
}

func newExtcapCmd() *cobra.Command {
	f := &extcapFlags{}
	cmd := &cobra.Command{
		Use:   "extcap [--install | --uninstall] | (Wireshark's extcap arguments)",
		Short: "Wireshark's own interface list: record unix sockets from Wireshark or tshark -i udskit",
		Long: `Make udskit a Wireshark extcap interface, like sshdump or androiddump: Wireshark and
tshark then list an interface "udskit" (tshark -D), whose options dialog offers the
listening sockets of this host (udskit ls --listening), the mode (interpose on the socket
path, or kernel/eBPF with connections already open), a process id (kernel mode), the
snapshot length and the server port that picks the dissector.

  udskit extcap --install     # once: a launcher into your personal extcap folder

The folder is the one the installed Wireshark reports (tshark -G folders: "Personal
Extcap path", or "Personal configuration"/extcap on Wireshark 4.0 and older); --dir
picks another (for example Wireshark's global extcap folder, as root). --uninstall
removes the launcher. Then restart Wireshark, or:

  tshark -i udskit -o extcap.udskit.socket:/run/app.sock -w app.pcapng

Wireshark's stop button, tshark -a/-c and Ctrl-C end the capture; an interposed socket
is put back as after Ctrl-C in udskit capture, and also when Wireshark goes away
without a word (the fifo's reader closes). Capturing other users' sockets needs the
same rights as udskit capture (root, or the socket's owner): run Wireshark with them,
or install the launcher for root.

The other arguments are Wireshark's (doc: man 4 extcap): --extcap-interfaces,
--extcap-interface udskit with --extcap-dlts, --extcap-config or --capture --fifo PATH.`,
		Example: `  # Install, list, capture PostgreSQL queries for 30 s:
  udskit extcap --install
  tshark -D | grep udskit
  sudo tshark -i udskit -o extcap.udskit.socket:/run/postgresql/.s.PGSQL.5432 \
      -a duration:30 -Y pgsql.query -T fields -e pgsql.query

  # Kernel mode, one process, connections already open included:
  sudo tshark -i udskit -o extcap.udskit.mode:kernel -o extcap.udskit.pid:1234 -w app.pcapng

  # What Wireshark asks (by hand):
  udskit extcap --extcap-interfaces
  udskit extcap --extcap-interface udskit --extcap-config`,
		Args: cobra.NoArgs,
		// Newer Wireshark versions may pass arguments this version does
		// not know; an extcap must not fail on them.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE:               func(cmd *cobra.Command, _ []string) error { return runExtcap(cmd, f) },
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.install, "install", false, "write a launcher into your personal Wireshark extcap folder, then exit")
	fl.BoolVar(&f.uninstall, "uninstall", false, "remove the launcher --install wrote, then exit")
	fl.StringVar(&f.dir, "dir", "", "with --install/--uninstall: the extcap folder (default: from tshark -G folders)")
	fl.StringVar(&f.tshark, "tshark", "", "with --install/--uninstall: the tshark to ask for the folder (default: tshark on PATH)")
	fl.BoolVar(&f.interfaces, "extcap-interfaces", false, "Wireshark: list the interfaces")
	fl.StringVar(&f.version, "extcap-version", "", "Wireshark: its version (accepted, not needed)")
	fl.StringVar(&f.iface, "extcap-interface", "", "Wireshark: the interface the other arguments are about (udskit)")
	fl.BoolVar(&f.dlts, "extcap-dlts", false, "Wireshark: list the interface's link types")
	fl.BoolVar(&f.config, "extcap-config", false, "Wireshark: list the interface's options")
	fl.StringVar(&f.reload, "extcap-reload-option", "", "Wireshark: list the values of one option again (--socket)")
	fl.BoolVar(&f.capture, "capture", false, "Wireshark: capture into --fifo")
	fl.StringVar(&f.fifo, "fifo", "", "Wireshark: the pipe to write pcapng into")
	fl.StringVar(&f.filter, "extcap-capture-filter", "", "Wireshark: a capture filter (none is supported: use a display filter)")
	fl.StringVar(&f.controlIn, "extcap-control-in", "", "Wireshark: control pipe (not used)")
	fl.StringVar(&f.controlOut, "extcap-control-out", "", "Wireshark: control pipe (not used)")
	fl.BoolVar(&f.debug, "debug", false, "Wireshark: debug output (not used)")
	fl.StringVar(&f.debugFile, "debug-file", "", "Wireshark: debug file (not used)")
	fl.StringVar(&f.opts.Socket, "socket", "", "capture option: the socket path to record")
	fl.StringVar(&f.opts.Mode, "mode", extcap.ModeInterpose, "capture option: interpose or kernel")
	fl.IntVar(&f.opts.PID, "pid", 0, "capture option, kernel mode: record every unix socket of this process")
	fl.IntVar(&f.opts.Snaplen, "snaplen", 0, "capture option: keep at most this many bytes per message (0: the mode's default)")
	fl.Uint16Var(&f.port, "port", 0, "capture option: the server TCP port the flows show (0: sniffed or guessed)")
	fl.SortFlags = false
	return cmd
}

func runExtcap(cmd *cobra.Command, f *extcapFlags) error {
	ctx := context.Background()
	out := cmd.OutOrStdout()
	switch {
	case f.install && f.uninstall:
		return usage(errors.New("--install or --uninstall, not both"))
	case f.install || f.uninstall:
		dir := f.dir
		if dir == "" {
			d, err := extcap.Folder(ctx, f.tshark)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			dir = d
		}
		if f.uninstall {
			p, err := extcap.Uninstall(ctx, extcap.InstallOptions{Dir: dir})
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			fmt.Fprintf(out, "removed %s\n", p)
			return nil
		}
		p, err := extcap.Install(ctx, extcap.InstallOptions{Dir: dir})
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		fmt.Fprintf(out, "installed %s\nrestart Wireshark, or check with: tshark -D | grep %s\n", p, extcap.Interface)
		return nil
	case f.interfaces:
		return extcap.WriteInterfaces(out)
	case f.iface == "":
		return usage(errors.New("give --extcap-interfaces, or --extcap-interface udskit with --extcap-dlts, --extcap-config or --capture --fifo PATH (or --install)"))
	case f.dlts:
		return extcap.WriteDLTs(out, f.iface)
	case f.config:
		choices, err := extcap.Choices(ctx)
		if err != nil {
			choices = nil // still offer the options; the path can be typed
		}
		if f.reload != "" {
			return extcap.WriteReload(out, f.iface, f.reload, choices)
		}
		return extcap.WriteConfig(out, f.iface, choices)
	case f.filter != "" && !f.capture:
		// Wireshark checks a capture filter by running us with it: any
		// output is the reason it is invalid.
		fmt.Fprintln(out, "udskit records whole connections and takes no capture filter: use a display filter")
		return nil
	case !f.capture:
		return usage(errors.New("--extcap-interface needs --extcap-dlts, --extcap-config or --capture --fifo PATH"))
	}
	if f.iface != extcap.Interface {
		return usage(extcap.ErrUnknownInterface(f.iface))
	}
	if f.filter != "" {
		return usage(errors.New("udskit takes no capture filter: clear it and use a display filter"))
	}
	o := f.opts
	o.Fifo, o.Port = f.fifo, f.port
	o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := service.NotifyContext(ctx)
	defer stop()
	res, err := extcap.Capture(ctx, o)
	if errors.Is(err, extcap.ErrOptions) {
		return usage(err)
	}
	if res != nil && res.Kernel != nil && res.Kernel.Lost() > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "udskit: %d events were lost in the kernel, %.1f%% of the data bytes (marked in the capture): a smaller snapshot length, or interpose mode, keeps every byte\n", res.Kernel.Lost(), res.Kernel.LossPercent())
	}
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	return nil
}

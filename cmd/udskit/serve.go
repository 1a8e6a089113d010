package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/sdnotify"
	"github.com/udskit/udskit/uds"
)

func init() { register(newServeCmd) }

func newServeCmd() *cobra.Command {
	var (
		mode         string
		allowUIDs    []string
		maxConns     int
		drainTimeout time.Duration
		quiet        bool
		hf           handoffFlags
	)
	cmd := &cobra.Command{
		Use:   "serve [ADDR]",
		Short: "Run a demo rpc server (echo, sleep, fail, stream, whoami) for trying udskit out",
		Long: `Serves the demo methods on ADDR for udskit clients and newline-JSON clients alike:

  echo    returns the request unchanged
  sleep   {"ms":N}: waits N ms, returns {"slept_ms":N}
  fail    {"code":"not_found","message":"..."}: always fails (default code failed_precondition)
  stream  {"n":N,"interval_ms":M}: streams N items (udskit clients)
  whoami  returns the caller's pid/uid/gid from the kernel (unix sockets)

Without ADDR it listens on $XDG_RUNTIME_DIR/udskit.sock, or in a private temp dir; the address
is printed on start. The socket is owner-only (0600) unless --mode says otherwise.
Connects and disconnects are logged on stderr with the peer's pid/uid/gid.

SIGTERM or Ctrl-C drains gracefully: stop accepting, let in-flight calls finish, exit when the
clients are gone or after --drain-timeout. A second Ctrl-C exits at once.

Zero-downtime replacement (docs/handoff.md): start with --handoff-socket PATH, then run
"udskit serve --handoff --handoff-socket PATH" (or any program using package handoff): it takes
the very same listening socket over, serves, commits, and the old instance drains and exits.
ADDR may be systemd:NAME or fd:N for a socket passed in by systemd or a supervisor.

Addresses: ` + uds.AddrForms,
		Example: `  udskit serve                       # prints e.g. listening on unix:/run/user/1000/udskit.sock
  udskit serve /tmp/demo.sock --mode 0660 --allow-uid 1000,1001
  udskit serve tcp:127.0.0.1:7000 --max-conns 100
  udskit serve /tmp/demo.sock --handoff-socket /tmp/demo.sock.handoff &
  udskit serve --handoff --handoff-socket /tmp/demo.sock.handoff   # takes over, old one drains
  (echo '{"id":1,"func":"echo","data":{"hi":1}}'; sleep 0.2) | socat - UNIX-CONNECT:/tmp/demo.sock`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bad := func(err error) error { return &exitError{code: 2, err: err} }
			var lopts uds.ListenOptions
			if mode != "" {
				m, err := strconv.ParseUint(mode, 8, 32)
				if err != nil || m > 0o777 {
					return bad(fmt.Errorf("--mode %q: want octal permission bits like 0600 or 0660", mode))
				}
				lopts.Mode = os.FileMode(m)
			}
			var uids []uint32
			for _, f := range allowUIDs {
				for _, s := range strings.Split(f, ",") {
					u, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
					if err != nil {
						return bad(fmt.Errorf("--allow-uid %q: want numeric uids, e.g. 1000,1001", s))
					}
					uids = append(uids, uint32(u))
				}
			}
			if maxConns < 0 {
				return bad(fmt.Errorf("--max-conns %d: want 0 (no limit) or more", maxConns))
			}
			if drainTimeout <= 0 {
				return bad(fmt.Errorf("--drain-timeout %v: must be positive", drainTimeout))
			}
			addr := ""
			cleanup := func() {}
			if len(args) == 1 {
				addr = args[0]
			} else {
				a, clean, err := demo.DefaultAddress()
				if err != nil {
					return err
				}
				addr, cleanup = a, clean
			}
			a, err := uds.ParseAddr(addr)
			if err != nil {
				return bad(err)
			}
			ctl, err := hf.control(addr)
			if err != nil {
				return bad(err)
			}
			if hf.detach {
				return hf.runDetached(cmd.Context())
			}
			if len(uids) > 0 {
				if !a.IsUnix() && a.Kind != uds.Passed {
					return bad(fmt.Errorf("--allow-uid needs a unix socket: TCP peers carry no kernel credentials"))
				}
				lopts.Policy = uds.AllowUIDs(uids...)
			}
			level := slog.LevelInfo
			if quiet {
				level = slog.LevelWarn
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			lopts.Logger = log

			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
			defer signal.Stop(sigs)

			hp, err := handoff.Start(cmd.Context(), []handoff.Spec{{Name: "rpc", Address: addr, Listen: lopts}},
				handoff.ProcessOptions{Control: ctl, Takeover: hf.takeover, Logger: log})
			if err != nil {
				cleanup()
				return err
			}
			defer hp.Close()
			srv := demo.New(hp.Listener("rpc"), demo.ServerOptions{MaxConns: maxConns, Logger: log})
			fmt.Fprintf(cmd.OutOrStdout(), "listening on %s (methods: %s)\n", srv.Addr(), strings.Join(demo.Methods, ", "))
			served := make(chan error, 1)
			go func() { served <- srv.Serve() }()
			if res, err := hp.Ready(cmd.Context()); err != nil {
				srv.Close()
				<-served
				return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
			} else if res != nil {
				fmt.Fprintln(cmd.OutOrStdout(), res.String())
			}
			why := "signal"
			select {
			case err := <-served:
				cleanup()
				return err
			case sig := <-sigs:
				why += " " + sig.String()
				defer cleanup()
			case <-hp.Committed():
				why = fmt.Sprintf("handed off to pid %d", hp.Successor().PID)
			}
			sdnotify.Stopping()
			log.Info("draining: no new connections; finishing in-flight calls", "why", why,
				"conns", srv.ActiveConns(), "timeout", drainTimeout.String())
			ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			go func() {
				for s := range sigs {
					if s == os.Interrupt {
						log.Warn("second interrupt: closing now")
						cancel()
						return
					}
				}
			}()
			err = srv.Shutdown(ctx)
			<-served
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				log.Warn("drain timeout: closed the remaining connections", "timeout", drainTimeout.String())
			case errors.Is(err, context.Canceled):
				log.Warn("closed at once")
			case err != nil:
				return err
			default:
				log.Info("drained; bye")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "", "socket file permission bits in octal (default 0600: owner only)")
	f.StringSliceVar(&allowUIDs, "allow-uid", nil, "only accept peers with these uids (comma-separated or repeated; unix sockets)")
	f.IntVar(&maxConns, "max-conns", 0, "most open connections; more are closed at once (0: no limit)")
	f.DurationVar(&drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM/Ctrl-C, how long to wait for in-flight calls and clients")
	f.BoolVarP(&quiet, "quiet", "q", false, "log only warnings (no connect/disconnect lines)")
	hf.add(f)
	return cmd
}

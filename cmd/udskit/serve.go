package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/service"
	"github.com/udskit/udskit/uds"
)

func init() { register(newServeCmd) }

func newServeCmd() *cobra.Command {
	var (
		mode         string
		allowUIDs    []string
		maxConns     int
		idleTimeout  time.Duration
		frameTimeout time.Duration
		drain        drainFlags
		quiet        bool
		logFormat    string
		hf           handoffFlags
		rf           remoteFlags
		metricsAddr  string
		noShm        bool
		shmInPlace   bool
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

Without ADDR it listens on $XDG_RUNTIME_DIR/udskit.sock, or in the private dir $TMPDIR/udskit-UID
(where udskit call without ADDR looks too); the address
is printed on start. The socket is owner-only (0600) unless --mode says otherwise.
Connects and disconnects are logged on stderr with the peer's pid/uid/gid.

` + service.HelpText + `

` + drainHelp + `

Zero-downtime replacement (docs/handoff.md): "udskit serve ADDR --handoff" (or any program
using package handoff) takes the very same listening socket over from the running instance,
serves, commits, and the old instance drains and exits. The running instance offers on the
control socket ADDR.handoff (owner-only; --handoff-socket PATH to choose it, none to turn it off).
ADDR may be systemd:NAME or fd:N for a socket passed in by systemd or a supervisor.

Addresses: ` + uds.AddrForms + "\n" + remoteHelp,
		Example: `  udskit serve                       # prints e.g. listening on unix:/run/user/1000/udskit.sock
  udskit serve tls:0.0.0.0:8443 --tls-cert svc.pem --tls-key svc-key.pem --tls-ca ca.pem \
      --allow-spiffe spiffe://prod.example/ns/app/sa/web   # mutual TLS; whoami answers the caller's SPIFFE ID
  udskit serve /tmp/demo.sock --mode 0660 --allow-uid 1000,1001
  udskit serve tcp:127.0.0.1:7000 --max-conns 100
  udskit serve /tmp/demo.sock --handoff      # takes the socket over; the old one drains
  udskit serve /run/udskit/sidecar.sock --mode 0660 --drain linger --drain-timeout 25s   # a pod's sidecar (docs/kubernetes.md)
  udskit serve /tmp/demo.sock --metrics tcp:127.0.0.1:9464   # curl http://127.0.0.1:9464/metrics
  udskit serve /tmp/demo.sock --shm-inplace   # handlers read large requests in the shared region: trusted clients only
  (echo '{"id":1,"func":"echo","data":{"hi":1}}'; sleep 0.2) | socat - UNIX-CONNECT:/tmp/demo.sock`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var lopts uds.ListenOptions
			if mode != "" {
				m, err := parseMode(mode)
				if err != nil {
					return err
				}
				lopts.Mode = m
			}
			uids, err := uds.UserIDs(allowUIDs...)
			if err != nil {
				return usage(fmt.Errorf("--allow-uid: %w", err))
			}
			if maxConns < 0 {
				return usage(fmt.Errorf("--max-conns %d: want 0 (no limit) or more", maxConns))
			}
			if shmInPlace && noShm {
				return usage(fmt.Errorf("--shm-inplace reads requests in the shared-memory region, which --no-shm turns off: drop one of them"))
			}
			if idleTimeout < 0 || frameTimeout < 0 {
				return usage(fmt.Errorf("--idle-timeout and --frame-timeout cannot be negative (0: no limit)"))
			}
			sopts := service.Options{Name: "serve"}
			if err := drain.apply(&sopts); err != nil {
				return err
			}
			addr := ""
			var res service.Result
			if len(args) == 1 {
				addr = args[0]
			} else {
				a, cleanup, err := demo.DefaultAddress()
				if err != nil {
					return err
				}
				defer func() {
					if !res.HandedOff { // a successor serves from the private dir now
						cleanup()
					}
				}()
				addr = a
			}
			a, err := parseAddr(addr)
			if err != nil {
				return err
			}
			sopts.Listen = []handoff.Spec{{Name: "rpc", Address: addr}}
			if done, err := hf.apply(cmd.Context(), &sopts); done || err != nil {
				return err
			}
			level := slog.LevelInfo
			if quiet {
				level = slog.LevelWarn
			}
			var log *slog.Logger
			switch logFormat {
			case "text":
				log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			case "json":
				log = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			default:
				return usage(fmt.Errorf("--log-format %q: want text or json", logFormat))
			}
			var local uds.Policy
			if len(uids) > 0 {
				if !a.IsUnix() && a.Kind != uds.Passed && a.Kind != uds.TLS {
					return usage(fmt.Errorf("--allow-uid needs a unix socket: TCP peers carry no kernel credentials (for remote peers: tls: with --allow-spiffe)"))
				}
				local = uds.AllowUIDs(uids...)
			}
			if err := rf.listen(a, local, &lopts, log); err != nil {
				return err
			}

			lopts.Logger = log
			sopts.Listen[0].Listen = lopts
			sopts.Logger = log
			mx, err := startMetrics(cmd.Context(), metricsAddr, log)
			if err != nil {
				return err
			}
			defer mx.close()
			var srv *demo.Server
			sopts.Status = func() []any { return []any{"conns", srv.ActiveConns()} }
			sopts.OnTakeover = func(r *handoff.TakeoverResult) { fmt.Fprintln(cmd.OutOrStdout(), r.String()) }
			res, err = service.Run(cmd.Context(), sopts,
				func(ctx context.Context, ls []*handoff.Listener) (service.Service, error) {
					srv = demo.New(ls[0], demo.ServerOptions{MaxConns: maxConns, Logger: log,
						RPC: mx.serverOptions(rpc.ServerOptions{IdleTimeout: idleTimeout, FrameTimeout: noLimitIfZero(frameTimeout), WriteTimeout: noLimitIfZero(frameTimeout), NoShm: noShm, ShmInPlace: shmInPlace})})
					mx.watchServe(srv, ls[0])
					fmt.Fprintf(cmd.OutOrStdout(), "listening on %s (methods: %s)\n", srv.Addr(), strings.Join(demo.Methods, ", "))
					warnDirRisks(log, srv.Addr())
					return srv, nil
				})
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "", "socket file permission bits in octal (default 0600: owner only)")
	f.StringSliceVar(&allowUIDs, "allow-uid", nil, "only accept peers with these uids or user names (comma-separated or repeated; unix sockets)")
	f.IntVar(&maxConns, "max-conns", uds.DefaultMaxConns(), "most open connections; more are closed at once (0: no limit; the default keeps 64 fds of the fd limit free)")
	f.DurationVar(&idleTimeout, "idle-timeout", 5*time.Minute, "close connections with no call for this long (goaway first; 0: never)")
	f.DurationVar(&frameTimeout, "frame-timeout", 30*time.Second, "close a client that takes longer than this to send a frame or line it started, or to read what it is sent (0: no limit)")
	drain.add(cmd)
	f.BoolVarP(&quiet, "quiet", "q", false, "log only warnings (no connect/disconnect lines)")
	f.BoolVar(&noShm, "no-shm", false, "refuse clients' shared-memory offers: every payload stays on the socket (by default, on Linux, local Go and Python clients send payloads of 16 KiB or more through a sealed memfd region)")
	f.BoolVar(&shmInPlace, "shm-inplace", false, "let handlers read requests that came through shared memory in place, in the client's slot, instead of a private copy (one copy less per large call, ServerOptions.ShmInPlace); the cost: the client can still write those bytes while the handler runs, so a raw handler can be raced by its client (a check, then a use, may see different bytes). For trusted clients, or handlers that read the request once like echo")
	addMetricsFlag(f, &metricsAddr)
	f.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json (as udskit proxy)")
	hf.add(f)
	rf.addServer(f)
	return cmd
}

// warnDirRisks logs a warning for each way another user could take the
// place of the server at addr (see uds.CheckDirs).
func warnDirRisks(log *slog.Logger, addr string) {
	for _, r := range uds.CheckDirs(addr) {
		log.Warn("unsafe socket directory: "+r.Problem, "fix", r.Fix)
	}
}

// noLimitIfZero maps a flag's 0 (no limit) to the library's negative.
func noLimitIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/internal/lifecycle"

	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/uds"
)

func init() {
	register(newProxyCmd)
}

func newProxyCmd() *cobra.Command {
	var (
		listens, tos []string
		mode         string
		owner        string
		allowUIDs    []string
		wait         bool
		dialTimeout  time.Duration
		maxConns     int
		idleTimeout  time.Duration
		drainTimeout time.Duration
		pipeSize     int
		sockBuf      int
		noSplice     bool
		spliceU2T    bool
		logFormat    string
		logLevel     string
		hf           handoffFlags
		captureFile  string
	)
	cmd := &cobra.Command{
		Use:   "proxy --listen ADDR --to ADDR [--listen ADDR --to ADDR ...]",
		Short: "Bridge unix <-> tcp (any direction), zero-copy, with per-connection logs",
		Long: `Forward every connection accepted on --listen to --to: unix -> tcp, tcp -> unix,
unix -> unix, tcp -> tcp, and Linux abstract names (@name), in any combination.

On Linux bytes move with splice(2) (no copy through user space), except from a
unix socket into a TCP socket, where a plain copy measured faster. Half-close is
forwarded: when one side finishes sending, the other side sees EOF while the
reverse direction keeps flowing. Each connection ends with one structured log
line: peer pid/uid/gid/command for unix clients (observations, not identities),
bytes each way, duration.

Give several --listen/--to pairs to serve several routes from one process; they
are paired in the order given. A unix listen socket is created owner-only (0600)
unless --mode says otherwise, and a stale socket file is replaced only if no
server answers on it.

--capture FILE records every relayed connection as pcapng (udskit capture --help
explains the output); while capturing, bytes go through the copy path, not splice.

` + lifecycle.HelpText + `

Zero-downtime replacement (docs/handoff.md): a new "udskit proxy --handoff ..." with the
same routes takes the listening sockets over, and the old proxy keeps relaying its open
connections (a long psql session) until they end or --drain-timeout passes. The running
proxy offers on the first unix listen path + .handoff (owner-only; --handoff-socket PATH
to choose it, none to turn it off).

Addresses: ` + uds.AddrForms,
		Example: `  # PostgreSQL listens only on TCP (e.g. in a container); give local tools the socket they expect:
  udskit proxy --listen /tmp/.s.PGSQL.5432 --mode 0666 --to tcp:127.0.0.1:5432 &
  psql -h /tmp -p 5432 -U postgres

  # A unix-only service exposed on loopback TCP, waiting for it to come up:
  udskit proxy --listen 127.0.0.1:6380 --to /run/redis/redis.sock --wait

  # Replace a running proxy without refusing a connection:
  udskit proxy --listen /tmp/.s.PGSQL.5432 --to tcp:127.0.0.1:5432 --handoff

  # Two routes in one process, only uid 1000 may use the unix one:
  udskit proxy --listen /run/app/pg.sock --to 10.0.0.5:5432 --allow-uid 1000 \
               --listen 127.0.0.1:6380 --to /run/redis/redis.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			routes, err := proxy.PairRoutes(listens, tos)
			if err != nil {
				return usage(err)
			}
			logger, err := newProxyLogger(logFormat, logLevel)
			if err != nil {
				return usage(err)
			}
			opts := proxy.Options{
				Wait: wait, DialTimeout: dialTimeout, MaxConns: maxConns, IdleTimeout: idleTimeout,
				PipeSize: pipeSize, SocketBuffer: sockBuf, NoSplice: noSplice, SpliceUnixToTCP: spliceU2T, Logger: logger,
			}
			if mode != "" {
				m, err := parseMode(mode)
				if err != nil {
					return err
				}
				opts.Listen.Mode = m
			}
			if owner != "" {
				uid, gid, err := uds.ParseOwner(owner)
				if err != nil {
					return usage(fmt.Errorf("--owner %q: %w", owner, err))
				}
				opts.Listen.UID, opts.Listen.GID = uid, gid
			}
			if len(allowUIDs) > 0 {
				uids, err := uds.UserIDs(allowUIDs...)
				if err != nil {
					return usage(fmt.Errorf("--allow-uid: %w", err))
				}
				opts.Listen.Policy = uds.AllowUIDs(uids...)
				for _, r := range routes {
					if a, _ := uds.ParseAddr(r.Listen); !a.IsUnix() && a.Kind != uds.Passed {
						return usage(fmt.Errorf("--allow-uid needs unix listen addresses: TCP peers carry no kernel credentials (route %s -> %s)", r.Listen, r.To))
					}
				}
			}
			if maxConns < 0 || idleTimeout < 0 || dialTimeout < 0 {
				return usage(errors.New("--max-conns and the timeouts cannot be negative"))
			}
			if err := checkDrain(drainTimeout); err != nil {
				return err
			}
			if captureFile != "" {
				closeCapture, err := proxyCapture(&opts, captureFile, logger)
				if err != nil {
					return &exitError{code: 1, err: err}
				}
				defer closeCapture()
			}

			ho := &handoffRun{flags: &hf, out: cmd.OutOrStdout()}
			if done, err := ho.prepare(cmd.Context(), listens...); done || err != nil {
				return err
			}
			if opts.Listen.Logger == nil {
				opts.Listen.Logger = logger
			}
			specs := make([]handoff.Spec, len(routes))
			for i, r := range routes {
				specs[i] = handoff.Spec{Name: fmt.Sprintf("route%d", i+1), Address: r.Listen, Listen: opts.Listen}
			}
			var p *proxy.Proxy
			_, err = lifecycle.Run(cmd.Context(), ho.options(lifecycle.Options{Name: "proxy", DrainTimeout: drainTimeout, Logger: logger,
				Status: func() []any {
					st := p.Stats()
					return []any{"active", st.Active, "total", st.Total, "bytes_in", st.BytesIn, "bytes_out", st.BytesOut}
				}}),
				func(ctx context.Context) (lifecycle.Service, error) {
					hls, err := ho.start(ctx, logger, specs...)
					if err != nil {
						return nil, err
					}
					ls := make([]proxy.Listener, len(hls))
					for i, l := range hls {
						ls[i] = l
					}
					if p, err = proxy.New(routes, ls, opts); err != nil {
						return nil, err
					}
					for i, a := range p.Addrs() {
						logger.Info("proxy listening", "listen", a.String(), "to", routes[i].To)
						warnDirRisks(logger, a.String())
					}
					return p, nil
				})
			ho.close()
			return err
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&listens, "listen", "l", nil, "address to accept clients on (repeatable; paired in order with --to)")
	f.StringArrayVarP(&tos, "to", "t", nil, "upstream address to forward each client to (repeatable)")
	f.StringVar(&mode, "mode", "", "permission bits of unix listen sockets, octal (default 0600: owner only)")
	f.StringVar(&owner, "owner", "", "chown unix listen sockets to USER[:GROUP] (names or numbers) before they are reachable")
	f.StringArrayVar(&allowUIDs, "allow-uid", nil, "only accept unix peers with this uid or user name (repeatable; refusals are logged)")
	f.BoolVar(&wait, "wait", false, "when the upstream is not up yet, retry until it accepts or --dial-timeout passes")
	f.DurationVar(&dialTimeout, "dial-timeout", 10*time.Second, "limit on each upstream connect, including --wait")
	f.IntVar(&maxConns, "max-conns", uds.DefaultMaxConns()/2, "at most this many client connections at once across all routes; more are closed at once, as in serve (0: no limit; the default keeps 64 fds of the fd limit free, two fds a connection)")
	f.DurationVar(&idleTimeout, "idle-timeout", 0, "close a connection after this long with no bytes either way (0: never)")
	addDrainFlag(cmd, &drainTimeout)
	f.IntVar(&pipeSize, "pipe-size", proxy.DefaultPipeSize, "splice pipe size per direction in bytes (Linux)")
	f.IntVar(&sockBuf, "socket-buffer", uds.DefaultSocketBuffer, "SO_SNDBUF of unix sockets in bytes, capped by net.core.wmem_max (-1: kernel default; TCP autotunes)")
	f.BoolVar(&noSplice, "no-splice", false, "copy through user space instead of splice(2) (for comparison)")
	f.BoolVar(&spliceU2T, "splice-unix-to-tcp", false, "splice the unix -> tcp direction too (by default it copies: measured faster)")
	f.StringVar(&captureFile, "capture", "", "record every relayed connection as pcapng into FILE (- for stdout); uses the copy path instead of splice")
	f.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	hf.add(f)
	f.SortFlags = false
	return cmd
}

func newProxyLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	ho := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

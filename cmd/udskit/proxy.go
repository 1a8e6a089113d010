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

	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/service"
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
		drain        drainFlags
		pipeSize     int
		sockBuf      int
		noSplice     bool
		spliceU2T    bool
		logFormat    string
		logLevel     string
		hf           handoffFlags
		captureFile  string
		rf           remoteFlags
		metricsAddr  string
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

` + service.HelpText + `

` + drainHelp + `

Zero-downtime replacement (docs/handoff.md): a new "udskit proxy --handoff ..." with the
same routes takes the listening sockets over, and the old proxy keeps relaying its open
connections (a long psql session) until they end or --drain-timeout passes. The running
proxy offers on the first unix listen path + .handoff (owner-only; --handoff-socket PATH
to choose it, none to turn it off).

Expose a local socket to remote services with mutual TLS (what socat + stunnel do), only
for the workloads named; --capture records the plaintext side:
  udskit proxy --listen tls:0.0.0.0:8443 --to unix:/run/app.sock --tls-cert svc.pem \
      --tls-key svc-key.pem --tls-ca ca.pem --allow-spiffe spiffe://prod.example/ns/app/sa/web
The --tls-* flags and --allow-spiffe/--allow-dns/--allow-any-cert apply to tls: listen
addresses; --to tls:... uses --tls-ca (and --tls-cert/--tls-key when no route listens
on tls:), --to ssh://... your ssh.

Addresses: ` + uds.AddrForms + "\n" + remoteHelp,
		Example: `  # PostgreSQL listens only on TCP (e.g. in a container); give local tools the socket they expect:
  udskit proxy --listen /tmp/.s.PGSQL.5432 --mode 0666 --to tcp:127.0.0.1:5432 &
  psql -h /tmp -p 5432 -U postgres

  # A unix-only service exposed on loopback TCP, waiting for it to come up:
  udskit proxy --listen 127.0.0.1:6380 --to /run/redis/redis.sock --wait

<<<<<<< HEAD
  # A sidecar in a pod: serve on after SIGTERM until the app's last connection has closed:
  udskit proxy --listen /run/udskit/db.sock --to tcp:10.0.0.5:5432 --drain linger --drain-timeout 25s
=======
  # Prometheus metrics (connections, bytes, refusals, draining) for scraping:
  udskit proxy --listen /tmp/.s.PGSQL.5432 --to tcp:127.0.0.1:5432 --metrics tcp:127.0.0.1:9465
>>>>>>> main

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
			var local uds.Policy
			if len(allowUIDs) > 0 {
				uids, err := uds.UserIDs(allowUIDs...)
				if err != nil {
					return usage(fmt.Errorf("--allow-uid: %w", err))
				}
				local = uds.AllowUIDs(uids...)
				for _, r := range routes {
					if a, _ := uds.ParseAddr(r.Listen); !a.IsUnix() && a.Kind != uds.Passed && a.Kind != uds.TLS {
						return usage(fmt.Errorf("--allow-uid needs unix listen addresses: TCP peers carry no kernel credentials (route %s -> %s)", r.Listen, r.To))
					}
				}
			}
			routeListen := make([]uds.ListenOptions, len(routes))
			anyTLSListen := false
			for i, r := range routes {
				la, err := parseAddr(r.Listen)
				if err != nil {
					return err
				}
				routeListen[i] = opts.Listen
				if la.Kind == uds.TLS {
					anyTLSListen = true
					if err := rf.listen(la, local, &routeListen[i], logger); err != nil {
						return err
					}
				} else {
					plain := remoteFlags{}
					if err := plain.listen(la, local, &routeListen[i], logger); err != nil {
						return err
					}
				}
			}
			if !anyTLSListen && rf.anyRemotePolicy() {
				return usage(errors.New("--allow-spiffe/--allow-dns/--allow-any-cert need a tls: --listen address"))
			}
			for _, r := range routes {
				ta, err := parseAddr(r.To)
				if err != nil {
					return err
				}
				dial := rf
				if anyTLSListen {
					// The certificate is the listener's; upstreams verify with the CA only.
					dial.cert, dial.key = "", ""
				}
				if ta.Kind == uds.TLS {
					if opts.DialTLS, opts.DialSSH, err = dial.dial(ta, logger); err != nil {
						return err
					}
				} else if ta.Kind == uds.SSH {
					opts.DialSSH = uds.SSHOptions{Binary: rf.ssh, Args: rf.sshArgs}
				}
			}
			if maxConns < 0 || idleTimeout < 0 || dialTimeout < 0 {
				return usage(errors.New("--max-conns and the timeouts cannot be negative"))
			}
			sopts := service.Options{Name: "proxy", Logger: logger}
			if err := drain.apply(&sopts); err != nil {
				return err
			}
			if opts.Listen.Logger == nil {
				opts.Listen.Logger = logger
			}
			sopts.Listen = make([]handoff.Spec, len(routes))
			for i, r := range routes {
				lo := routeListen[i]
				if lo.Logger == nil {
					lo.Logger = logger
				}
				sopts.Listen[i] = handoff.Spec{Name: fmt.Sprintf("route%d", i+1), Address: r.Listen, Listen: lo}
			}
			if captureFile != "" {
				closeCapture, err := proxyCapture(&opts, captureFile, logger)
				if err != nil {
					return &exitError{code: 1, err: err}
				}
				defer closeCapture()
			}

			if done, err := hf.apply(cmd.Context(), &sopts); done || err != nil {
				return err
			}
			mx, err := startMetrics(cmd.Context(), metricsAddr, logger)
			if err != nil {
				return err
			}
			defer mx.close()
			var p *proxy.Proxy
			sopts.Status = func() []any {
				st := p.Stats()
				return []any{"active", st.Active, "total", st.Total, "bytes_in", st.BytesIn, "bytes_out", st.BytesOut}
			}
			sopts.OnTakeover = func(r *handoff.TakeoverResult) { fmt.Fprintln(cmd.OutOrStdout(), r.String()) }
			_, err = service.Run(cmd.Context(), sopts,
				func(ctx context.Context, hls []*handoff.Listener) (service.Service, error) {
					ls := make([]proxy.Listener, len(hls))
					for i, l := range hls {
						ls[i] = l
					}
					if p, err = proxy.New(routes, ls, opts); err != nil {
						return nil, err
					}
					mx.watchProxy(p, ls)
					for i, a := range p.Addrs() {
						logger.Info("proxy listening", "listen", a.String(), "to", routes[i].To)
						warnDirRisks(logger, a.String())
					}
					return p, nil
				})
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
	drain.add(cmd)
	f.IntVar(&pipeSize, "pipe-size", proxy.DefaultPipeSize, "splice pipe size per direction in bytes (Linux)")
	f.IntVar(&sockBuf, "socket-buffer", uds.DefaultSocketBuffer, "SO_SNDBUF of unix sockets in bytes, capped by net.core.wmem_max (-1: kernel default; TCP autotunes)")
	f.BoolVar(&noSplice, "no-splice", false, "copy through user space instead of splice(2) (for comparison)")
	f.BoolVar(&spliceU2T, "splice-unix-to-tcp", false, "splice the unix -> tcp direction too (by default it copies: measured faster)")
	addMetricsFlag(f, &metricsAddr)
	f.StringVar(&captureFile, "capture", "", "record every relayed connection as pcapng into FILE (- for stdout); uses the copy path instead of splice")
	f.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	rf.addServer(f)
	f.StringVar(&rf.serverName, "tls-server-name", "", "--to tls:: the name the upstream's certificate must carry (default: its host)")
	f.StringVar(&rf.serverSPIFFEID, "tls-server-spiffe", "", "--to tls:: the SPIFFE ID the upstream's certificate must carry")
	f.StringArrayVar(&rf.sshArgs, "ssh-arg", nil, "--to ssh://: an extra argument for ssh (repeatable)")
	f.StringVar(&rf.ssh, "ssh", "ssh", "--to ssh://: the ssh client to run")
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

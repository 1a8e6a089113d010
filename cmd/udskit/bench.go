package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/udskit/udskit/bench"
	"github.com/udskit/udskit/service"
)

func init() {
	register(newBenchCmd)
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:                "bench-server",
			Short:              "Internal: the server process of udskit bench",
			Hidden:             true,
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				if code := bench.ServeMain(cmd.Context(), args, os.Stdin, os.Stdout, os.Stderr); code != 0 {
					return &exitError{code: code, err: errors.New("bench-server failed")}
				}
				return nil
			},
		}
	})
}

func transportHelp() string {
	var b strings.Builder
	for _, n := range bench.Available() {
		t, _ := bench.Lookup(n)
		fmt.Fprintf(&b, "  %-12s %s\n", n, t.PerRequest)
	}
	return b.String()
}

func newBenchCmd() *cobra.Command {
	var (
		transports, sizes, concs string
		duration, warmup         time.Duration
		repeat, noisyRetries     int
		noisyRetryTime           time.Duration
		requests                 int64
		rate                     float64
		jsonOut, chartOut        string
		compact                  bool
		quiet                    bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark udskit rpc vs grpc-go vs raw sockets, unix vs tcp, side by side",
		Long: `Measures echo request/response over each transport, payload size and concurrency level, with
the server in a separate process (this binary re-executed), and prints one aligned table:
requests/s, p50/p99/p99.9 latency (HDR histogram), heap allocations per request in client and
server, CPU per request, and each cell's ratio to grpc-go and to raw over the same network.

Fairness: every transport sends the same payload bytes and, per (size, concurrency), the same
number of requests (sized so the slowest transport runs about --duration); warm-up is not
recorded; --repeat N runs each cell N times (transport order rotated) and reports the median
and spread, flagging cells whose req/s vary more than 10% as NOISY. --noisy-retries K measures
a group with a noisy cell again, up to K extra rounds (all within --noisy-retry-time), and
reports each cell's last N rounds; the summary says how many cells were repeated and stayed noisy.

Transports (what one request does):
` + transportHelp() + `
Concurrency C means C callers each waiting for its answer before the next request.
See docs/bench.md for how to read the output.`,
		Example: `  udskit bench                                   # full default matrix (~1.5 minutes)
  udskit bench --sizes 1k,64k --conc 1 --duration 1s --chart out.svg
  udskit bench --transports raw-unix,raw-tcp --repeat 5 --json res.json
  udskit bench --rate 5000 --sizes 1k --conc 4   # fixed rate, coordinated-omission-safe`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := bench.Config{Duration: duration, Warmup: warmup, Repeat: repeat, Requests: requests, Rate: rate,
				NoisyRetries: noisyRetries, NoisyRetryTime: noisyRetryTime}
			if transports != "" {
				cfg.Transports = strings.Split(transports, ",")
				if _, err := bench.ResolveTransports(cfg.Transports); err != nil {
					return usage(fmt.Errorf("--transports: %w", err))
				}
			}
			if sizes != "" {
				s, err := bench.ParseSizes(sizes)
				if err != nil {
					return usage(fmt.Errorf("--sizes: %w", err))
				}
				cfg.Sizes = s
			}
			if concs != "" {
				for _, f := range strings.Split(concs, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(f))
					if err != nil || n < 1 || n > 4096 {
						return usage(fmt.Errorf("--conc: %q is not a number of callers from 1 to 4096", f))
					}
					cfg.Conc = append(cfg.Conc, n)
				}
			}
			switch {
			case duration <= 0:
				return usage(fmt.Errorf("--duration %v: must be positive, e.g. 2s or 500ms", duration))
			case warmup < 0:
				return usage(fmt.Errorf("--warmup %v: must be 0 or positive", warmup))
			case repeat < 1 || repeat > 100:
				return usage(fmt.Errorf("--repeat %d: want 1..100", repeat))
			case rate < 0:
				return usage(fmt.Errorf("--rate %v: must be positive (requests/s across all callers)", rate))
			case requests < 0:
				return usage(fmt.Errorf("--requests %d: must be positive", requests))
			}
			if warmup == 0 {
				cfg.Warmup = -1 // a minimal probe, still unrecorded
			}
			if chartOut != "" && !strings.HasSuffix(chartOut, ".svg") && !strings.HasSuffix(chartOut, ".png") {
				return usage(fmt.Errorf("--chart %q: want a file name ending in .svg or .png", chartOut))
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own executable to start the server: %w", err)
			}
			cfg.ServerCmd = []string{exe, "bench-server"}
			if !quiet {
				cfg.Progress = cmd.ErrOrStderr()
			}
			ctx, stop := service.NotifyContext(cmd.Context())
			defer stop()
			rep, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			write := rep.WriteTable
			if compact {
				write = rep.WriteCompact
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
			}
			if jsonOut != "" {
				f, err := os.Create(jsonOut)
				if err != nil {
					return err
				}
				if err := rep.WriteJSON(f); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "wrote", jsonOut)
			}
			if chartOut != "" {
				if err := rep.WriteChartFile(chartOut); err != nil {
					return err
				}
				fmt.Fprintln(cmd.ErrOrStderr(), "wrote", chartOut)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&transports, "transports", "", "comma-separated transports (default: all of "+strings.Join(bench.DefaultTransports, ",")+" built in)")
	f.StringVar(&sizes, "sizes", "1KiB,10KiB,100KiB,1MiB", "comma-separated payload sizes (bytes, k/KiB, m/MiB)")
	f.StringVar(&concs, "conc", "1,16", "comma-separated concurrency levels (concurrent callers)")
	f.DurationVar(&duration, "duration", bench.DefaultDuration, "target time of one measured sample for the slowest transport")
	f.DurationVar(&warmup, "warmup", bench.DefaultWarmup, "unrecorded warm-up per transport per (size, conc) group")
	f.IntVar(&repeat, "repeat", 1, "measured samples per cell; reports median and spread")
	f.IntVar(&noisyRetries, "noisy-retries", 0, "extra rounds (at most) for a group while a cell is NOISY over its last --repeat rounds")
	f.DurationVar(&noisyRetryTime, "noisy-retry-time", 60*time.Second, "time cap for all --noisy-retries rounds together")
	f.Int64Var(&requests, "requests", 0, "fixed requests per sample instead of sizing from the warm-up")
	f.Float64Var(&rate, "rate", 0, "fixed-rate mode: total requests/s; latency counted from the intended send time")
	f.StringVar(&jsonOut, "json", "", "also write every cell as JSON to this file")
	f.BoolVar(&compact, "compact", false, "a three-line summary and a table under 100 columns (make demo); the rest in --json")
	f.StringVar(&chartOut, "chart", "", "also draw the chart to this .svg (or .png, needs rsvg-convert) file")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress line on stderr")
	return cmd
}

// Command udskit-benchshm runs udskit's shared-memory rows side by side
// with cloudwego/shmipc-go v0.2.0 (its copy API and its zero-copy buffers),
// the bare socket echo and udskit's socket path, in one interleaved run with
// the server in another process (the `udskit bench` engine, package bench).
// It is its own module so that the udskit library never imports shmipc-go.
//
//	cd tools/benchshm && go run . -sizes 64,64k,1m -conc 1,16 -duration 2s -repeat 3
//
// Rows: rpc-shm (udskit, shared memory on), rpc-shm-inplace (the same
// with the server's opt-in ServerOptions.ShmInPlace), rpc-shm-inplace-view
// (that, the client reading answers in place with CallRawView), rpc-unix (udskit, socket
// path), raw-unix (bare fixed-size socket echo: the floor), shmipc-copy,
// shmipc-zerocopy; with -shm-conns 1,2,4 also each rpc-shm* row with
// rpc.ClientOptions.ShmConns 1, 2 and 4 (rows rpc-shm/sc1 ...). The table's header line gives the machine's memcpy
// bandwidth measured in the same run. -server-env GOMAXPROCS=1 runs the
// server processes with one P (docs/performance.md, "Shared memory").
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/udskit/udskit/bench"
)

func main() {
	traceFromEnv()
	if len(os.Args) > 1 && os.Args[1] == "bench-server" {
		os.Exit(serverMain(os.Args[2:]))
	}
	transports := flag.String("transports", "rpc-shm,rpc-shm-inplace,rpc-shm-inplace-view,rpc-unix,raw-unix,shmipc-copy,shmipc-zerocopy", "comma-separated transports; <row>/sc<N> is a shared-memory row with ClientOptions.ShmConns N (see -shm-conns)")
	shmConns := flag.String("shm-conns", "", "also run each rpc-shm* row with rpc.ClientOptions.ShmConns set to each of these (e.g. 1,2,4,16: rows rpc-shm/sc1 ...), interleaved with the rest")
	sizes := flag.String("sizes", "64,64k,1m", "payload sizes")
	concs := flag.String("conc", "1,16", "concurrent callers")
	duration := flag.Duration("duration", 2*time.Second, "time per cell (for the slowest transport)")
	warmup := flag.Duration("warmup", 300*time.Millisecond, "warm-up per cell")
	repeat := flag.Int("repeat", 3, "rounds (transport order rotated each round)")
	jsonOut := flag.String("json", "", "also write the report as JSON to this file")
	serverEnv := flag.String("server-env", "", "comma-separated KEY=VALUE added to the server process's environment (e.g. GOMAXPROCS=1)")
	flag.Parse()
	exe, err := os.Executable()
	if err != nil {
		fail(err)
	}
	rows, err := expandShmConns(strings.Split(*transports, ","), *shmConns)
	if err != nil {
		fail(err)
	}
	for _, r := range rows {
		if err := ensureShmConnsRow(strings.TrimSpace(r)); err != nil {
			fail(err)
		}
	}
	cfg := bench.Config{
		Transports: rows,
		Duration:   *duration, Warmup: *warmup, Repeat: *repeat,
		ServerCmd: []string{exe, "bench-server"},
		Progress:  os.Stderr,
	}
	if cfg.ServerEnv, err = parseEnv(*serverEnv); err != nil {
		fail(err)
	}
	if cfg.Sizes, err = bench.ParseSizes(*sizes); err != nil {
		fail(err)
	}
	for _, f := range strings.Split(*concs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			fail(fmt.Errorf("-conc: %q is not a number of callers from 1 to 4096", f))
		}
		cfg.Conc = append(cfg.Conc, n)
	}
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		fail(err)
	}
	rep.WriteTable(os.Stdout)
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		if err := rep.WriteJSON(f); err != nil {
			fail(err)
		}
	}
}

// serverMain is the bench engine's server process ("bench-server
// -transport NAME ..."), with NAME's -shm-conns row registered first.
func serverMain(args []string) int {
	for i, a := range args {
		name, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "transport=")
		if !ok && strings.TrimLeft(a, "-") == "transport" && i+1 < len(args) {
			name, ok = args[i+1], true
		}
		if ok {
			if err := ensureShmConnsRow(name); err != nil {
				fmt.Fprintln(os.Stderr, "bench-server:", err)
				return 2
			}
		}
	}
	return bench.ServeMain(context.Background(), args, os.Stdin, os.Stdout, os.Stderr)
}

// parseEnv reads -server-env: comma-separated KEY=VALUE pairs.
func parseEnv(s string) ([]string, error) {
	var out []string
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, fmt.Errorf("-server-env: %q is not KEY=VALUE", kv)
		}
		out = append(out, kv)
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "udskit-benchshm:", err)
	os.Exit(1)
}

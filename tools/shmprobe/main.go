package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// config is one run's settings (the flags).
type config struct {
	n, size   int
	duration  time.Duration
	warmup    time.Duration
	spin      time.Duration // futex variant: spin before sleeping
	sockConns int
	full      bool // compare every answer byte for byte (else the stamps)
}

// variant is one row: a base design and the GOMAXPROCS of each side
// (0: the default).
type variant struct {
	name, base     string
	cprocs, sprocs int
	spin           time.Duration // futex: the spin before sleeping (-1: -spin)
	gosched        int           // futex: a caller's runtime.Gosched looks before it parks (-1: 4)
}

// result is one cell: one variant in one round.
type result struct {
	calls          int64
	elapsed        time.Duration
	cliCPU, srvCPU time.Duration
	p50            time.Duration
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.calls) / r.elapsed.Seconds()
}

// cpuPerCall is both processes' CPU per call.
func (r result) cpuPerCall() time.Duration {
	if r.calls == 0 {
		return 0
	}
	return (r.cliCPU + r.srvCPU) / time.Duration(r.calls)
}

var bases = map[string]bool{"raw": true, "sock": true, "futex": true, "spin": true, "futexd": true}

// parseVariant reads "futex", "spin/c1", "futex/c1/s1".
func parseVariant(s string) (variant, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, "/")
	v := variant{name: s, base: parts[0], spin: -1, gosched: -1}
	if !bases[v.base] {
		return v, fmt.Errorf("variant %q: the base must be raw, sock, futex, futexd or spin", s)
	}
	for _, p := range parts[1:] {
		if len(p) < 2 || (p[0] != 'c' && p[0] != 's' && p[0] != 'w' && p[0] != 'g') {
			return v, fmt.Errorf("variant %q: suffix %q is not /cN (client GOMAXPROCS), /sN (server GOMAXPROCS), /wN (futex: spin N µs) or /gN (futex: N Gosched before parking)", s, p)
		}
		k, err := strconv.Atoi(p[1:])
		if p[0] == 'g' {
			if err != nil || k < 0 || k > 1e6 || (v.base != "futex" && v.base != "futexd") {
				return v, fmt.Errorf("variant %q: %q wants a futex variant and a count from 0 to 1000000", s, p)
			}
			v.gosched = k
			continue
		}
		if p[0] == 'w' {
			if err != nil || k < 0 || k > 1e6 || (v.base != "futex" && v.base != "futexd") {
				return v, fmt.Errorf("variant %q: %q wants a futex variant and a spin from 0 to 1000000 µs", s, p)
			}
			v.spin = time.Duration(k) * time.Microsecond
			continue
		}
		if err != nil || k < 1 || k > 256 {
			return v, fmt.Errorf("variant %q: %q wants a GOMAXPROCS from 1 to 256", s, p)
		}
		if p[0] == 'c' {
			v.cprocs = k
		} else {
			v.sprocs = k
		}
	}
	return v, nil
}

func parseVariants(s string) ([]variant, error) {
	var out []variant
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		v, err := parseVariant(f)
		if err != nil {
			return nil, err
		}
		if !seen[v.name] {
			seen[v.name] = true
			out = append(out, v)
		}
	}
	if !seen["raw"] {
		out = append([]variant{{name: "raw", base: "raw"}}, out...)
	}
	return out, nil
}

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	variants := flag.String("variants", "raw,sock,futex,futexd,spin", "comma-separated variants (raw, sock, futex, futexd, spin, each optionally /cN /sN for the client's / server's GOMAXPROCS); raw, the floor, is always run")
	n := flag.Int("conc", 16, "caller goroutines (and raw connections)")
	size := flag.String("size", "64k", "payload bytes (k and m suffixes)")
	duration := flag.Duration("duration", time.Second, "measured time per cell")
	warmup := flag.Duration("warmup", 200*time.Millisecond, "warm-up per cell")
	repeat := flag.Int("repeat", 3, "rounds (variant order rotated each round)")
	spin := flag.Duration("spin", 2*time.Microsecond, "futex variant: how long each side spins before it sleeps")
	sockConns := flag.Int("sock-conns", 2, "sock variant: socketpairs the descriptor frames share")
	check := flag.String("check", "full", "full: compare every answer byte for byte; stamp: compare its length and per-call stamps only")
	flag.Parse()
	cfg := config{duration: *duration, warmup: *warmup, spin: *spin, sockConns: *sockConns, n: *n}
	var err error
	if cfg.size, err = parseSize(*size); err != nil {
		fail(err)
	}
	switch *check {
	case "full":
		cfg.full = true
	case "stamp":
	default:
		fail(fmt.Errorf("-check %q: want full or stamp", *check))
	}
	if err := cfg.validate(*repeat); err != nil {
		fail(err)
	}
	vs, err := parseVariants(*variants)
	if err != nil {
		fail(err)
	}
	res, err := runAll(cfg, vs, *repeat, os.Stderr)
	if err != nil {
		fail(err)
	}
	writeReport(os.Stdout, cfg, vs, res)
}

func (c config) validate(repeat int) error {
	switch {
	case c.n < 1 || c.n > maxCallers:
		return fmt.Errorf("-conc %d: want 1 to %d", c.n, maxCallers)
	case c.size < 16 || c.size > 16<<20:
		return fmt.Errorf("-size %d: want 16 bytes to 16 MiB", c.size)
	case c.duration <= 0 || c.duration > 10*time.Minute:
		return fmt.Errorf("-duration %v: want more than 0 and at most 10m", c.duration)
	case c.warmup < 0 || c.warmup > time.Minute:
		return fmt.Errorf("-warmup %v: want 0 to 1m", c.warmup)
	case repeat < 1 || repeat > 100:
		return fmt.Errorf("-repeat %d: want 1 to 100", repeat)
	case c.spin < 0 || c.spin > time.Second:
		return fmt.Errorf("-spin %v: want 0 to 1s", c.spin)
	case c.sockConns < 1 || c.sockConns > c.n:
		return fmt.Errorf("-sock-conns %d: want 1 to -conc (%d)", c.sockConns, c.n)
	}
	return nil
}

func parseSize(s string) (int, error) {
	mult := 1
	t := strings.ToLower(strings.TrimSpace(s))
	switch {
	case strings.HasSuffix(t, "k"):
		mult, t = 1<<10, strings.TrimSuffix(t, "k")
	case strings.HasSuffix(t, "m"):
		mult, t = 1<<20, strings.TrimSuffix(t, "m")
	}
	v, err := strconv.Atoi(t)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with k or m", s)
	}
	return v * mult, nil
}

// runAll runs repeat rounds of every variant, the order rotated each round.
// res[v][r] is variant v's cell in round r.
func runAll(cfg config, vs []variant, repeat int, progress io.Writer) ([][]result, error) {
	res := make([][]result, len(vs))
	for i := range res {
		res[i] = make([]result, repeat)
	}
	for r := 0; r < repeat; r++ {
		for k := range vs {
			i := (k + r) % len(vs)
			got, err := runCell(cfg, vs[i])
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, vs[i].name, err)
			}
			res[i][r] = got
			if progress != nil {
				fmt.Fprintf(progress, "round %d %-12s %9.0f req/s  %6.1f µs CPU/call (client %.1f, server %.1f)  p50 %v\n",
					r+1, vs[i].name, got.rate(), us(got.cpuPerCall()),
					us(got.cliCPU)/float64(max(got.calls, 1)), us(got.srvCPU)/float64(max(got.calls, 1)), got.p50)
			}
		}
	}
	return res, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summary is one variant's medians over the rounds.
type summary struct {
	rate, ratio, cpu, cli, srv, p50 float64
	ratios                          []float64
	// cpuRatio is the floor's CPU per call over this variant's, per
	// round, median: the rate ratio two fully busy cores would give, which
	// the other work on a loaded machine disturbs less than the rates.
	cpuRatio float64
}

func summarize(vs []variant, res [][]result) []summary {
	floor := 0
	for i, v := range vs {
		if v.name == "raw" {
			floor = i
		}
	}
	out := make([]summary, len(vs))
	for i := range vs {
		var rate, cpu, cli, srv, p50, cpuRatios []float64
		var s summary
		for r, c := range res[i] {
			rate = append(rate, c.rate())
			cpu = append(cpu, us(c.cpuPerCall()))
			calls := float64(max(c.calls, 1))
			cli = append(cli, us(c.cliCPU)/calls)
			srv = append(srv, us(c.srvCPU)/calls)
			p50 = append(p50, us(c.p50))
			if f := res[floor][r].rate(); f > 0 {
				s.ratios = append(s.ratios, c.rate()/f)
			}
			if c.cpuPerCall() > 0 {
				cpuRatios = append(cpuRatios, float64(res[floor][r].cpuPerCall())/float64(c.cpuPerCall()))
			}
		}
		s.rate, s.cpu, s.cli, s.srv, s.p50 = median(rate), median(cpu), median(cli), median(srv), median(p50)
		s.ratio = median(s.ratios)
		s.cpuRatio = median(cpuRatios)
		out[i] = s
	}
	return out
}

func writeReport(w io.Writer, cfg config, vs []variant, res [][]result) {
	load, _ := os.ReadFile("/proc/loadavg")
	check := "every answer compared byte for byte"
	if !cfg.full {
		check = "every answer's length and stamps compared"
	}
	fmt.Fprintf(w, "shmprobe: %d callers × %d bytes, %v per cell, %d rounds, %d CPUs, %s; load average %s; %s UTC\n",
		cfg.n, cfg.size, cfg.duration, len(res[0]), runtime.NumCPU(), check,
		strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "),
		time.Now().UTC().Format("2006-01-02 15:04"))
	fmt.Fprintln(w, "| variant | req/s | vs raw (median; by round) | CPU µs/call (client + server) | raw's CPU/call ÷ this | p50 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	sums := summarize(vs, res)
	best := -1
	for i, v := range vs {
		s := sums[i]
		var rs []string
		for _, r := range s.ratios {
			rs = append(rs, fmt.Sprintf("%.2f", r))
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2fx (%s) | %.1f (%.1f + %.1f) | %.2fx | %.1f µs |\n",
			v.name, s.rate, s.ratio, strings.Join(rs, " / "), s.cpu, s.cli, s.srv, s.cpuRatio, s.p50)
		if v.name != "raw" && (best < 0 || s.ratio > sums[best].ratio) {
			best = i
		}
	}
	var floor float64
	for i, v := range vs {
		if v.name == "raw" {
			floor = sums[i].rate
		}
	}
	if best >= 0 && floor > 0 {
		target := 4 * floor
		cores := target * sums[best].cpu / 1e6
		fmt.Fprintf(w, "best: %s at %.2fx the floor (CPU per call %.2fx less); 4x this run's floor = %.0f req/s needs, at its %.1f µs CPU per call, %.2f cores busy (this machine: %d)\n",
			vs[best].name, sums[best].ratio, sums[best].cpuRatio, target, sums[best].cpu, cores, runtime.NumCPU())
	}
}

var errMismatch = errors.New("answer mismatch")

func fail(err error) {
	fmt.Fprintln(os.Stderr, "shmprobe:", err)
	os.Exit(1)
}

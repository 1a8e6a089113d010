package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/udskit/udskit/internal/pollticker"
	"github.com/udskit/udskit/internal/stats"
)

// server is one running server process.
type server struct {
	t       *Transport
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	addr    string // udskit address syntax
	network string
	dialTo  string // what net.Dial takes
	ctl     net.Conn
	ctlR    *bufio.Reader
	stderr  *bytes.Buffer
	done    chan error
}

func startServer(ctx context.Context, cfg Config, t *Transport, dir string) (*server, error) {
	addr := "unix:" + filepath.Join(dir, t.Name+".sock")
	if t.Network == "tcp" {
		addr = "tcp:127.0.0.1:0"
	}
	ctlPath := filepath.Join(dir, t.Name+".ctl")
	args := append(append([]string{}, cfg.ServerCmd[1:]...), "--transport", t.Name, "--addr", addr, "--ctl", ctlPath)
	cmd := exec.Command(cfg.ServerCmd[0], args...)
	cmd.Env = append(os.Environ(), cfg.ServerEnv...)
	s := &server{t: t, cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan error, 1), network: t.Network}
	cmd.Stderr = &lockedWriter{w: s.stderr}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s.stdin = stdin
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s server (%s): %w", t.Name, cfg.ServerCmd[0], err)
	}
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReaderSize(stdout, 1024).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, stdout)
	}()
	go func() { s.done <- cmd.Wait() }()
	fail := func(why string) (*server, error) {
		stdin.Close()
		cmd.Process.Kill()
		<-s.done
		return nil, fmt.Errorf("%s server: %s; its stderr: %s", t.Name, why, strings.TrimSpace(s.stderr.String()))
	}
	var line string
	wait := time.NewTimer(15 * time.Second)
	defer wait.Stop() // no runtime timer left pending while cells run (see stallWatch)
	select {
	case line = <-ready:
	case <-wait.C:
		return fail("not ready after 15s")
	case <-ctx.Done():
		return fail(ctx.Err().Error())
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "READY" {
		return fail(fmt.Sprintf("bad ready line %q", strings.TrimSpace(line)))
	}
	s.addr = f[1]
	s.dialTo = strings.TrimPrefix(strings.TrimPrefix(f[1], "tcp:"), "unix:")
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", f[2])
	if err != nil {
		return fail("control socket: " + err.Error())
	}
	s.ctl, s.ctlR = c, bufio.NewReaderSize(c, 1024)
	return s, nil
}

func (s *server) stats() (Stats, error) {
	s.ctl.SetDeadline(time.Now().Add(10 * time.Second))
	defer s.ctl.SetDeadline(time.Time{}) // a deadline is a runtime timer: none while cells run (see stallWatch)
	if _, err := io.WriteString(s.ctl, "stats\n"); err != nil {
		return Stats{}, fmt.Errorf("%s server stats: %w", s.t.Name, err)
	}
	line, err := readLine(s.ctlR, maxCtlLine)
	if err != nil {
		return Stats{}, fmt.Errorf("%s server stats: %w", s.t.Name, err)
	}
	return ParseStats(line)
}

func (s *server) stop() {
	if s.ctl != nil {
		s.ctl.Close()
	}
	s.stdin.Close() // the server exits on stdin EOF
	wait := time.NewTimer(5 * time.Second)
	defer wait.Stop()
	select {
	case <-s.done:
	case <-wait.C:
		s.cmd.Process.Kill()
		<-s.done
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.w.(*bytes.Buffer); ok && b.Len() > 64<<10 {
		return len(p), nil // keep the first 64 KiB of server stderr
	}
	return l.w.Write(p)
}

// sample is one measured run of one cell.
type sample struct {
	n          int64
	elapsed    time.Duration
	hist       *hdr.Histogram
	cli, srv   Stats // deltas
	truncated  bool
	scheduleNS int64 // fixed-rate: the interval between intended sends
}

type histogramT = hdr.Histogram

// stallGrace is how long after a sample's time cap measure waits for the
// requests still in flight before it declares the transport stalled.
var stallGrace = 10 * time.Second

// ErrStalled reports a sample in which a request never completed: Run fails
// with it instead of hanging.
var ErrStalled = errors.New("bench: stalled")

func newHist() *hdr.Histogram { return hdr.New(100, int64(time.Minute), 3) }

// warmup runs the callers unrecorded for d and returns the completed request
// rate. Each caller's first echo is checked byte for byte.
func warmup(ctx context.Context, cl *Client, payload []byte, d time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(cl.Callers))
	start := time.Now()
	for _, c := range cl.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for ctx.Err() == nil {
				resp, err := c.Call(context.Background(), payload)
				if err != nil {
					errc <- err
					return
				}
				if first && !bytes.Equal(resp, payload) || len(resp) != len(payload) {
					errc <- fmt.Errorf("echo mismatch: sent %d bytes, got %d different bytes back", len(payload), len(resp))
					return
				}
				first = false
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	el := time.Since(start)
	if done.Load() == 0 {
		return 0, errors.New("no request completed during warm-up")
	}
	return float64(done.Load()) / el.Seconds(), nil
}

// measure runs exactly n requests (unless maxTime passes first) over the
// callers and records their latencies. With rate > 0 requests are scheduled
// at fixed intervals and latency counts from the intended send time.
func measure(ctx context.Context, cl *Client, srvStats func() (Stats, error), payload []byte, n int64, rate float64, maxTime time.Duration) (*sample, error) {
	hists := make([]*hdr.Histogram, len(cl.Callers))
	for i := range hists {
		hists[i] = newHist()
	}
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) / rate)
	}
	s0, err := srvStats()
	if err != nil {
		return nil, err
	}
	c0 := ReadStats()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(cl.Callers))
	deadline := time.Now().Add(maxTime)
	start := time.Now()
	// A request that never gets an answer (a stalled server or transport)
	// must not hang the run: stallGrace after the sample's time cap, cancel
	// the calls' ctx and close the client (callers on plain conns ignore
	// ctx), and fail the sample. One ctx for the whole sample: no
	// per-request allocation that would show up in allocs/req.
	cctx, cancelCalls := context.WithCancel(ctx)
	defer cancelCalls()
	var stalled atomic.Bool
	stopWatch := stallWatch(maxTime+stallGrace, func() {
		stalled.Store(true)
		cancelCalls()
		cl.Close()
	})
	for i, c := range cl.Callers {
		wg.Add(1)
		go func(h *hdr.Histogram) {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= n || ctx.Err() != nil {
					return
				}
				var t0 time.Time
				if interval > 0 {
					t0 = start.Add(time.Duration(k) * interval)
					if d := time.Until(t0); d > 0 {
						time.Sleep(d)
					}
				} else {
					t0 = time.Now()
				}
				if t0.After(deadline) {
					next.Store(n) // stop every caller
					return
				}
				resp, err := c.Call(cctx, payload)
				if err != nil {
					errc <- err
					next.Store(n)
					return
				}
				if len(resp) != len(payload) {
					errc <- fmt.Errorf("echo: sent %d bytes, got %d back", len(payload), len(resp))
					next.Store(n)
					return
				}
				h.RecordValue(int64(time.Since(t0)))
			}
		}(hists[i])
	}
	wg.Wait()
	stopWatch()
	elapsed := time.Since(start)
	c1 := ReadStats()
	close(errc)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if stalled.Load() {
		return nil, fmt.Errorf("%w: a request got no answer within %s (sample time cap %s + %s grace); the server or transport hung",
			ErrStalled, (maxTime + stallGrace).Round(time.Millisecond), maxTime.Round(time.Millisecond), stallGrace)
	}
	if err := <-errc; err != nil {
		return nil, err
	}
	s1, err := srvStats()
	if err != nil {
		return nil, err
	}
	all := newHist()
	for _, h := range hists {
		all.Merge(h)
	}
	smp := &sample{n: all.TotalCount(), elapsed: elapsed, hist: all, cli: diff(c1, c0), srv: diff(s1, s0)}
	smp.truncated = smp.n < n
	return smp, nil
}

func diff(a, b Stats) Stats {
	return Stats{Mallocs: a.Mallocs - b.Mallocs, UserNS: a.UserNS - b.UserNS, SysNS: a.SysNS - b.SysNS}
}

// Run measures the matrix in cfg and returns the report. Servers start once
// per transport and stay up; each (concurrency, size) group dials every
// transport, warms each one up, sizes the request count from the slowest, and
// then measures cfg.Repeat rounds with the transport order rotated per round.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ts, err := ResolveTransports(cfg.Transports)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "udskit-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep := &Report{
		System:  CollectSystem(),
		Started: time.Now().UTC(),
		Settings: Settings{
			Transports: names(ts), Sizes: cfg.Sizes, Conc: cfg.Conc,
			DurationSec: cfg.Duration.Seconds(), WarmupSec: effectiveWarmup(cfg).Seconds(),
			Repeat: cfg.Repeat, Requests: cfg.Requests, Rate: cfg.Rate, NoisySpread: cfg.NoisySpread,
			NoisyRetries: cfg.NoisyRetries, NoisyRetrySec: cfg.NoisyRetryTime.Seconds(),
		},
	}
	retry := retryPolicy{keep: cfg.Repeat, spread: cfg.NoisySpread, max: cfg.NoisyRetries,
		until: time.Now().Add(cfg.NoisyRetryTime)}
	servers := make([]*server, len(ts))
	defer func() {
		for _, s := range servers {
			if s != nil {
				s.stop()
			}
		}
	}()
	for i, t := range ts {
		if servers[i], err = startServer(ctx, cfg, t, dir); err != nil {
			return nil, err
		}
	}
	prog := newProgress(cfg, len(ts))
	for _, conc := range cfg.Conc {
		for _, size := range cfg.Sizes {
			prog.group()
			cells, err := runGroup(ctx, cfg, ts, servers, conc, size, prog, retry)
			if err != nil {
				return nil, err
			}
			rep.Cells = append(rep.Cells, cells...)
		}
	}
	prog.finish()
	rep.finish()
	return rep, nil
}

// effectiveWarmup is cfg.Warmup, or the minimal 100ms probe for a negative one.
func effectiveWarmup(cfg Config) time.Duration {
	if cfg.Warmup < 0 {
		return 100 * time.Millisecond
	}
	return cfg.Warmup
}

func names(ts []*Transport) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

func runGroup(ctx context.Context, cfg Config, ts []*Transport, servers []*server, conc, size int, prog *progress, retry retryPolicy) ([]Cell, error) {
	payload := Payload(size)
	clients := make([]*Client, len(ts))
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	rates := make([]float64, len(ts))
	wu := effectiveWarmup(cfg)
	for i, t := range ts {
		prog.show(fmt.Sprintf("warm-up %s %s c=%d", t.Name, FormatSize(size), conc))
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cl, err := t.Dial(dctx, servers[i].network, servers[i].dialTo, conc)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		if len(cl.Callers) != conc {
			cl.Close()
			return nil, fmt.Errorf("%s: dial gave %d callers, want %d", t.Name, len(cl.Callers), conc)
		}
		clients[i] = cl
		if rates[i], err = warmup(ctx, cl, payload, wu); err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s c=%d warm-up: %w", t.Name, FormatSize(size), conc, err)
		}
		prog.warmed()
	}
	n := cfg.Requests
	switch {
	case n > 0:
	case cfg.Rate > 0:
		n = int64(cfg.Rate * cfg.Duration.Seconds())
	default:
		slowest := rates[0]
		for _, r := range rates {
			slowest = min(slowest, r)
		}
		n = int64(slowest * cfg.Duration.Seconds())
	}
	n = max(n, int64(conc))
	maxTime := 3*cfg.Duration + 2*time.Second
	if cfg.Requests > 0 {
		maxTime = 10 * time.Minute
	}
	samples := make([][]*sample, len(ts))
	rounds := make([][]float64, len(ts)) // req/s per round, for the retry policy
	extra := 0
	for r := 0; r < cfg.Repeat || retry.again(rounds, extra, time.Now()); r++ {
		if r >= cfg.Repeat {
			extra++
		}
		for k := range ts {
			i := (k + r) % len(ts)
			t := ts[i]
			label := fmt.Sprintf("%s %s c=%d round %d/%d", t.Name, FormatSize(size), conc, r+1, cfg.Repeat)
			if r >= cfg.Repeat {
				label = fmt.Sprintf("%s %s c=%d noisy: extra round %d/%d", t.Name, FormatSize(size), conc, extra, retry.max)
			}
			prog.show(label)
			s, err := measure(ctx, clients[i], servers[i].stats, payload, n, cfg.Rate, maxTime)
			if err != nil {
				return nil, fmt.Errorf("%s %s c=%d: %w", t.Name, FormatSize(size), conc, err)
			}
			prog.sampled(s.elapsed)
			samples[i] = append(samples[i], s)
			rounds[i] = append(rounds[i], float64(s.n)/s.elapsed.Seconds())
		}
	}
	cells := make([]Cell, len(ts))
	for i, t := range ts {
		cells[i] = makeCell(cfg, t, size, conc, n, samples[i][len(samples[i])-cfg.Repeat:])
		cells[i].ExtraRounds = extra
	}
	return cells, nil
}

func makeCell(cfg Config, t *Transport, size, conc int, n int64, ss []*sample) Cell {
	c := Cell{Transport: t.Name, Family: t.Family, Network: t.Network, Size: size, Conc: conc, Requests: n, Repeats: len(ss)}
	if t.Over != "" {
		c.Network = t.Over
	}
	all := newHist()
	var rps, ca, sa, ccpu, scpu []float64
	for _, s := range ss {
		all.Merge(s.hist)
		rps = append(rps, float64(s.n)/s.elapsed.Seconds())
		c.P50Rounds = append(c.P50Rounds, float64(s.hist.ValueAtQuantile(50))/1e3)
		ca = append(ca, float64(s.cli.Mallocs)/float64(max(s.n, 1)))
		sa = append(sa, float64(s.srv.Mallocs)/float64(max(s.n, 1)))
		ccpu = append(ccpu, s.cli.CPU().Seconds())
		scpu = append(scpu, s.srv.CPU().Seconds())
		c.Truncated = c.Truncated || s.truncated
	}
	c.RPS, c.RPSRounds = stats.Median(rps), rps
	c.RPSMin, c.RPSMax = rps[0], rps[0]
	for _, r := range rps {
		c.RPSMin, c.RPSMax = min(c.RPSMin, r), max(c.RPSMax, r)
	}
	if c.RPS > 0 {
		c.Spread = (c.RPSMax - c.RPSMin) / c.RPS
	}
	c.Noisy = len(ss) > 1 && c.Spread > cfg.NoisySpread
	us := func(q float64) float64 { return float64(all.ValueAtQuantile(q)) / 1e3 }
	c.P50us, c.P99us, c.P999us, c.MaxUS = us(50), us(99), us(99.9), float64(all.Max())/1e3
	c.ClientAllocsPerReq, c.ServerAllocsPerReq = stats.Median(ca), stats.Median(sa)
	c.ClientCPUSec, c.ServerCPUSec = stats.Median(ccpu), stats.Median(scpu)
	c.CPUusPerReq = (c.ClientCPUSec + c.ServerCPUSec) / float64(max(n, 1)) * 1e6
	return c
}

// stallWatch runs f once after d unless stop is called first. It waits on a
// pollticker tick, not a runtime timer: while a runtime timer is pending, every
// idle wait of the process's threads has a timeout, which costs each round
// trip of the transport being measured (a 16 ms ticker made the raw echo's
// lone caller about 10 % slower: docs/performance.md, "No runtime timer pending while calls flow"). The floor
// must not pay for the harness.
func stallWatch(d time.Duration, f func()) (stop func()) {
	t := pollticker.NewTicker(d)
	done := make(chan struct{})
	go func() {
		defer t.Stop()
		select {
		case <-t.C:
			f()
		case <-done:
		}
	}()
	return func() { close(done) }
}

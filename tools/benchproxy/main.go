// Command udskit-benchproxy measures udskit's proxy side by side with socat and with
// no proxy at all, in one run, on one machine:
//
//	go run ./tools/benchproxy                   # defaults: 5 rounds, 2s streams, 20000 round trips
//	go run ./tools/benchproxy -dir unix-tcp     # the other direction (client on unix, server on TCP)
//	go run ./tools/benchproxy -dir unix-unix    # also tcp-tcp
//	go run ./tools/benchproxy -h                # flags
//
// Topology for -dir tcp-unix (the default; issue 5's "unix-only server exposed
// on loopback TCP"): the client speaks TCP to 127.0.0.1, the server listens on
// a unix socket. The same server also listens on TCP so that "direct" can be
// measured over both transports:
//
//	direct-unix   client --unix--> server
//	direct-tcp    client --tcp---> server                        (the client's own transport)
//	udskit        client --tcp---> udskit proxy --unix--> server (splice for bulk)
//	udskit-copy   same, --no-splice (user-space copy)
//	socat         client --tcp---> socat TCP-LISTEN:P,fork UNIX-CONNECT:S --unix--> server
//	udskit-alt    with -alt-env K=V and/or -alt-bin PATH: udskit again with extra
//	              environment (GOMAXPROCS, GODEBUG, ...) or from another build of
//	              this command (A/B of a change in the same run)
//
// -dir unix-tcp swaps the sides (seed 000: a TCP-only server made reachable as
// a unix socket; socat UNIX-LISTEN:S,fork TCP:127.0.0.1:P); unix-unix and
// tcp-tcp use the same transport on both sides. "direct" in the ratios is
// always the client's own transport.
//
// Each proxy runs as its own process (udskit via this binary re-executing
// itself with -serve-proxy, so only the proxy package is measured); socat gets
// no tuning options, as a user would type it. Every variant uses the same
// client code, write size, duration and warm-up. Rounds are interleaved and
// the variant order rotates each round; medians and min-max are reported, and
// the udskit/socat ratios are computed per round (both measured minutes apart
// at most) before taking their median.
//
// Throughput: one connection streams for -duration, half-closes, and the
// server answers with the byte count (checked). CPU time of the bench process
// (client + server) and of the proxy process (threads and, for socat, its
// forked children) is sampled around each stream and reported per GB moved.
// Latency: -msg byte ping-pong after 200 warm-up round trips; mean and median
// per round trip.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/udskit/udskit/internal/stats"
	"github.com/udskit/udskit/proxy"
)

func main() {
	proxyProcs := flag.Int("proxy-procs", 0, "GOMAXPROCS for the udskit proxy process (0: Go's default)")
	serveProxy := flag.String("serve-proxy", "", "internal: run the proxy LISTEN=TO until stdin closes")
	noSplice := flag.Bool("no-splice", false, "internal: with -serve-proxy, copy instead of splice")
	sockBuf := flag.Int("sockbuf", 0, "udskit SO_SNDBUF of unix sockets (0: the proxy's default, -1: the kernel's)")
	rounds := flag.Int("rounds", 5, "rounds; each runs every variant once (order rotated), medians are reported")
	dur := flag.Duration("duration", 2*time.Second, "streaming time per throughput sample")
	rts := flag.Int("rt", 20000, "round trips per latency sample")
	msg := flag.Int("msg", 64, "round-trip message size in bytes")
	chunk := flag.Int("chunk", 256<<10, "write size for the stream")
	socatBin := flag.String("socat", "socat", "socat binary")
	pipeSize := flag.Int("pipe-size", 0, "udskit splice pipe size (0: the proxy's default)")
	dir := flag.String("dir", "tcp-unix", "client-server transports: tcp-unix (client TCP, server unix) or unix-tcp")
	altEnv := flag.String("alt-env", "", "also run \"udskit-alt\": the udskit proxy with these extra environment variables (comma-separated K=V, e.g. GOMAXPROCS=1), side by side")
	altBin := flag.String("alt-bin", "", "run \"udskit-alt\" with this other proxybench build (its -serve-proxy mode, default options), side by side")
	only := flag.String("variants", "", "comma-separated subset of variants to run (default all)")
	clientSndbuf := flag.Int("client-unix-sndbuf", 0, "SO_SNDBUF of the stream client's socket when it dials a unix socket, in bytes (0: the kernel's default, net.core.wmem_default); unix sockets do not autotune, so this bounds the bytes in flight to whatever listens there")
	flag.Parse()
	if *serveProxy != "" {
		runProxy(*serveProxy, *noSplice, *pipeSize, *sockBuf)
		return
	}
	cfg := config{rounds: *rounds, dur: *dur, rts: *rts, msg: *msg, chunk: *chunk, socat: *socatBin,
		pipeSize: *pipeSize, sockBuf: *sockBuf, proxyProcs: *proxyProcs, dir: *dir, clientSndbuf: *clientSndbuf}
	if *altEnv != "" {
		cfg.altEnv = strings.Split(*altEnv, ",")
	}
	cfg.altBin = *altBin
	if *only != "" {
		cfg.only = strings.Split(*only, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

type config struct {
	rounds, rts, msg, chunk int
	dur                     time.Duration
	socat                   string
	pipeSize, proxyProcs    int
	sockBuf, clientSndbuf   int
	dir, altBin             string
	only, altEnv            []string
}

// runProxy is the child mode: one route, until stdin reaches EOF or SIGTERM.
func runProxy(route string, noSplice bool, pipeSize, sockBuf int) {
	listen, to, _ := strings.Cut(route, "=")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := proxy.Listen(context.Background(), []proxy.Route{{Listen: listen, To: to}},
		proxy.Options{NoSplice: noSplice, PipeSize: pipeSize, SocketBuffer: sockBuf, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
	go func() { io.Copy(io.Discard, os.Stdin); p.Close() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() { <-sig; p.Close() }()
	p.Serve()
}

type variant struct {
	name  string
	env   []string // extra environment for the child
	addr  string   // where the client dials (unix:PATH or tcp:HOST:PORT)
	start []string // child process to start, nil for direct
	pid   int      // child pid once started
}

type sample struct {
	gbps            float64
	cpuSelf, cpuPx  float64 // CPU seconds per GB moved (bench process; proxy process)
	rtMean, rtP50   float64 // µs per round trip
	haveCPU, havePx bool
}

// run measures every variant and writes the table to out, progress to progress.
func run(ctx context.Context, cfg config, out, progress io.Writer) error {
	tmp, err := os.MkdirTemp("", "proxybench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sock := filepath.Join(tmp, "server.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer ul.Close()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer tl.Close()
	go serve(ul)
	go serve(tl)
	tcpServer := tl.Addr().String()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	udskit := func(route string, extra ...string) []string {
		return append([]string{self, "-serve-proxy", route, fmt.Sprintf("-pipe-size=%d", cfg.pipeSize),
			fmt.Sprintf("-sockbuf=%d", cfg.sockBuf)}, extra...)
	}
	alt := func(route string) []string {
		if cfg.altBin != "" {
			return []string{cfg.altBin, "-serve-proxy", route}
		}
		return udskit(route)
	}
	variants := []*variant{
		{name: "direct-unix", addr: "unix:" + sock},
		{name: "direct-tcp", addr: "tcp:" + tcpServer},
	}
	client, server, ok := strings.Cut(cfg.dir, "-")
	if !ok || (client != "tcp" && client != "unix") || (server != "tcp" && server != "unix") {
		return fmt.Errorf("-dir %q: want CLIENT-SERVER with each tcp or unix (tcp-unix, unix-tcp, unix-unix, tcp-tcp)", cfg.dir)
	}
	// "direct" for the ratios is the client's own transport: what it would
	// use to reach the server if the server offered it.
	base := "direct-" + client
	upstream, socatTo := "unix:"+sock, "UNIX-CONNECT:"+sock
	if server == "tcp" {
		upstream, socatTo = "tcp:"+tcpServer, "TCP:"+tcpServer
	}
	ports := freePorts(4)
	// listen returns the proxy's listen address (unix:PATH or tcp:HOST:PORT)
	// and socat's listen argument for the i-th proxy.
	listen := func(i int, name string) (string, string) {
		if client == "tcp" {
			return fmt.Sprintf("tcp:127.0.0.1:%d", ports[i]), fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", ports[i])
		}
		path := filepath.Join(tmp, name+".sock")
		return "unix:" + path, "UNIX-LISTEN:" + path + ",fork"
	}
	la, _ := listen(0, "udskit")
	variants = append(variants, &variant{name: "udskit", addr: la, start: udskit(la + "=" + upstream)})
	la, _ = listen(1, "copy")
	variants = append(variants, &variant{name: "udskit-copy", addr: la, start: udskit(la+"="+upstream, "-no-splice")})
	la, socatListen := listen(2, "socat")
	variants = append(variants, &variant{name: "socat", addr: la, start: []string{cfg.socat, socatListen, socatTo}})
	if cfg.altEnv != nil || cfg.altBin != "" {
		la, _ = listen(3, "alt")
		variants = append(variants, &variant{name: "udskit-alt", env: cfg.altEnv, addr: la, start: alt(la + "=" + upstream)})
	}
	if _, err := exec.LookPath(cfg.socat); err != nil {
		fmt.Fprintln(progress, "proxybench: socat not found, skipping it")
		variants = slices.DeleteFunc(variants, func(v *variant) bool { return v.name == "socat" })
	}
	if len(cfg.only) > 0 {
		variants = slices.DeleteFunc(variants, func(v *variant) bool { return !slices.Contains(cfg.only, v.name) })
		if len(variants) == 0 {
			return fmt.Errorf("-variants %q matches none of direct-unix, direct-tcp, udskit, udskit-copy, socat", strings.Join(cfg.only, ","))
		}
	}
	for _, v := range variants {
		if v.start == nil {
			continue
		}
		cmd := exec.Command(v.start[0], v.start[1:]...)
		cmd.Env = append(os.Environ(), v.env...)
		if cfg.proxyProcs > 0 && strings.HasPrefix(v.name, "udskit") {
			cmd.Env = append(cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", cfg.proxyProcs))
		}
		stdin, _ := cmd.StdinPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", v.name, err)
		}
		v.pid = cmd.Process.Pid
		defer func() { stdin.Close(); cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
		if err := waitListening(v.addr); err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}

	fmt.Fprintf(out, "proxybench: -dir %s, %d rounds, stream %v x %d KiB writes, %d round trips of %d B; GOMAXPROCS=%d, %d CPUs\n",
		cfg.dir, cfg.rounds, cfg.dur, cfg.chunk>>10, cfg.rts, cfg.msg, runtime.GOMAXPROCS(0), runtime.NumCPU())
	if cfg.clientSndbuf > 0 {
		fmt.Fprintf(out, "proxybench: the stream client sets SO_SNDBUF %d on unix sockets\n", cfg.clientSndbuf)
	}
	res := map[string][]sample{}
	for r := range cfg.rounds {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := measure(ctx, v, cfg)
			if err != nil {
				return err
			}
			res[v.name] = append(res[v.name], s)
			fmt.Fprintf(progress, "round %d %-12s %7.2f Gbit/s  cpu s/GB %5.2f + %5.2f  rt mean %6.1f µs p50 %6.1f µs\n",
				r+1, v.name, s.gbps, s.cpuSelf, s.cpuPx, s.rtMean, s.rtP50)
		}
	}
	report(out, variants, res, base, cfg.msg)
	return nil
}

func measure(ctx context.Context, v *variant, cfg config) (sample, error) {
	var s sample
	self0 := selfCPU()
	px0, okPx := treeCPU(v.pid)
	gbps, bytes, err := stream(ctx, v.addr, cfg.dur, cfg.chunk, cfg.clientSndbuf)
	if err != nil {
		return s, fmt.Errorf("%s stream: %w", v.name, err)
	}
	gb := float64(bytes) / 1e9
	s.gbps = gbps
	if self1 := selfCPU(); self1 > 0 {
		s.cpuSelf, s.haveCPU = (self1-self0).Seconds()/gb, true
	}
	if v.pid != 0 && okPx {
		// socat's child notices the end a little later; give it a moment.
		time.Sleep(50 * time.Millisecond)
		if px1, ok := treeCPU(v.pid); ok {
			s.cpuPx, s.havePx = (px1-px0).Seconds()/gb, true
		}
	}
	s.rtMean, s.rtP50, err = pingPong(ctx, v.addr, cfg.rts, cfg.msg)
	if err != nil {
		return s, fmt.Errorf("%s ping-pong: %w", v.name, err)
	}
	return s, nil
}

func pick(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func report(w io.Writer, variants []*variant, res map[string][]sample, base string, msgSize int) {
	thr := func(s sample) float64 { return s.gbps }
	mean := func(s sample) float64 { return s.rtMean }
	p50 := func(s sample) float64 { return s.rtP50 }
	med := func(name string, f func(sample) float64) float64 { return stats.Median(pick(res[name], f)) }
	span := func(name string, f func(sample) float64, format string) string {
		xs := pick(res[name], f)
		return fmt.Sprintf(format+"–"+format, slices.Min(xs), slices.Max(xs))
	}
	_, haveBase := res[base]
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| path | stream Gbit/s (min–max) | vs %s | CPU s/GB bench proc | CPU s/GB proxy | %d B rt mean µs (min–max) | p50 µs | added mean µs | added p50 µs |\n", base, msgSize)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, v := range variants {
		n := v.name
		ratio, addM, addP := "n/a", "n/a", "n/a"
		if haveBase {
			ratio = fmt.Sprintf("%.2fx", med(n, thr)/med(base, thr))
			addM = fmt.Sprintf("%+.1f", med(n, mean)-med(base, mean))
			addP = fmt.Sprintf("%+.1f", med(n, p50)-med(base, p50))
		}
		cpuPx := "-"
		if v.pid != 0 {
			cpuPx = fmt.Sprintf("%.2f", med(n, func(s sample) float64 { return s.cpuPx }))
		}
		fmt.Fprintf(w, "| %s | %.2f (%s) | %s | %.2f | %s | %.1f (%s) | %.1f | %s | %s |\n", n,
			med(n, thr), span(n, thr, "%.1f"), ratio, med(n, func(s sample) float64 { return s.cpuSelf }), cpuPx,
			med(n, mean), span(n, mean, "%.0f"), med(n, p50), addM, addP)
	}
	us, ok1 := res["udskit"]
	so, ok2 := res["socat"]
	if !ok1 || !ok2 || !haveBase {
		return
	}
	// Per-round ratios: each round measured udskit, socat and the base within
	// seconds of each other, so the noise of a shared machine cancels better.
	b := res[base]
	var tr, lm, lp []float64
	for i := range min(len(us), len(so), len(b)) {
		tr = append(tr, us[i].gbps/so[i].gbps)
		lm = append(lm, (us[i].rtMean-b[i].rtMean)/(so[i].rtMean-b[i].rtMean))
		lp = append(lp, (us[i].rtP50-b[i].rtP50)/(so[i].rtP50-b[i].rtP50))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "udskit/socat throughput: median %.2fx (per round %.2f–%.2f); target >= 4x\n", stats.Median(tr), slices.Min(tr), slices.Max(tr))
	fmt.Fprintf(w, "udskit/%s throughput: %.2fx; target >= 0.8x\n", base, med("udskit", thr)/med(base, thr))
	fmt.Fprintf(w, "udskit added latency / socat's: mean %.2f (per round %.2f–%.2f), p50 %.2f (per round %.2f–%.2f); target <= 0.5\n",
		stats.Median(lm), slices.Min(lm), slices.Max(lm), stats.Median(lp), slices.Min(lp), slices.Max(lp))
}

// serve answers each conn: the first byte picks the mode.
//
//	'S' stream: read to EOF, reply with the 8-byte count.
//	'E' echo:   copy back what arrives.
func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var m [1]byte
			if _, err := io.ReadFull(c, m[:]); err != nil {
				return
			}
			switch m[0] {
			case 'S':
				buf := make([]byte, 256<<10)
				var n uint64
				for {
					k, err := c.Read(buf)
					n += uint64(k)
					if err != nil {
						break
					}
				}
				binary.Write(c, binary.BigEndian, n)
			case 'E':
				io.Copy(c, c)
			}
		}()
	}
}

func dial(addr string) (net.Conn, error) {
	network, a, _ := strings.Cut(addr, ":")
	return net.DialTimeout(network, a, 5*time.Second)
}

// stream writes chunk-sized writes for dur, half-closes, and checks the
// server's byte count. It returns Gbit/s and the bytes moved. A unixSndbuf
// above 0 is set as SO_SNDBUF when addr is a unix socket.
func stream(ctx context.Context, addr string, dur time.Duration, chunk, unixSndbuf int) (float64, uint64, error) {
	c, err := dial(addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if uc, ok := c.(*net.UnixConn); ok && unixSndbuf > 0 {
		if err := uc.SetWriteBuffer(unixSndbuf); err != nil {
			return 0, 0, fmt.Errorf("client SO_SNDBUF: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	buf := make([]byte, chunk)
	buf[0] = 'S'
	start := time.Now()
	var sent uint64
	if _, err := c.Write(buf[:1]); err != nil {
		return 0, 0, err
	}
	for time.Since(start) < dur {
		n, err := c.Write(buf)
		sent += uint64(n)
		if err != nil {
			return 0, 0, err
		}
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	var got uint64
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := binary.Read(c, binary.BigEndian, &got); err != nil {
		return 0, 0, fmt.Errorf("reading the count: %w", err)
	}
	el := time.Since(start)
	if got != sent {
		return 0, 0, fmt.Errorf("server got %d bytes, %d sent", got, sent)
	}
	return float64(got) * 8 / el.Seconds() / 1e9, got, nil
}

// pingPong returns the mean and median round trip in µs.
func pingPong(ctx context.Context, addr string, n, size int) (float64, float64, error) {
	c, err := dial(addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := c.Write([]byte{'E'}); err != nil {
		return 0, 0, err
	}
	out, in := make([]byte, size), make([]byte, size)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	// Warm up, then measure.
	for range 200 {
		c.Write(out)
		io.ReadFull(c, in)
	}
	each := make([]float64, n)
	start := time.Now()
	prev := start
	for i := range n {
		binary.LittleEndian.PutUint32(out, uint32(i))
		if _, err := c.Write(out); err != nil {
			return 0, 0, err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return 0, 0, err
		}
		if binary.LittleEndian.Uint32(in) != uint32(i) {
			return 0, 0, errors.New("echo mismatch")
		}
		now := time.Now()
		each[i] = float64(now.Sub(prev).Nanoseconds()) / 1e3
		prev = now
	}
	mean := float64(time.Since(start).Nanoseconds()) / 1e3 / float64(n)
	return mean, stats.Median(each), nil
}

func freePorts(n int) []int {
	var ls []net.Listener
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func waitListening(addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := dial(addr); err == nil {
			c.Write([]byte{'E'}) // harmless echo conn
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening after 10s", addr)
}

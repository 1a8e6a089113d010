// Command proxybench measures udskit's proxy side by side with socat and with
// no proxy at all, in one run, on one machine:
//
//	go run ./bench/proxy            # defaults: 3 rounds, 2s streams, 20000 round trips
//	go run ./bench/proxy -h         # flags
//
// Topology (the seed 000 / issue 5 case): the client speaks TCP to 127.0.0.1,
// the server listens on a unix socket.
//
//	direct-unix   client --unix--> server                        (best case)
//	direct-tcp    client --tcp---> server                        (what "direct" means below)
//	udskit        client --tcp---> udskit proxy --unix--> server (splice)
//	udskit-copy   same, --no-splice (user-space copy)
//	socat         client --tcp---> socat (fork, defaults) --unix--> server
//
// Each proxy runs as its own process (udskit via this binary re-executing
// itself with -serve-proxy, so only the proxy package is measured). Variants
// are interleaved within each round and the median of the rounds is reported.
// Throughput: one connection streams for -duration, half-closes, and the server
// answers with the byte count. Latency: 64-byte ping-pong, mean per round trip.
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
	"syscall"
	"time"

	"github.com/udskit/udskit/proxy"
)

var (
	proxyProcs *int
	pipeArg    string
)

func main() {
	proxyProcs = flag.Int("proxy-procs", 0, "GOMAXPROCS for the udskit proxy process (0: Go's default)")
	serveProxy := flag.String("serve-proxy", "", "internal: run the proxy LISTEN=TO until stdin closes")
	noSplice := flag.Bool("no-splice", false, "internal: with -serve-proxy, copy instead of splice")
	rounds := flag.Int("rounds", 3, "rounds; each runs every variant once, medians are reported")
	dur := flag.Duration("duration", 2*time.Second, "streaming time per throughput sample")
	rts := flag.Int("rt", 20000, "64-byte round trips per latency sample")
	msg := flag.Int("msg", 64, "round-trip message size in bytes")
	chunk := flag.Int("chunk", 256<<10, "write size for the stream")
	socatBin := flag.String("socat", "socat", "socat binary")
	pipeSize := flag.Int("pipe-size", 0, "udskit splice pipe size (0: the proxy's default)")
	flag.Parse()
	if *serveProxy != "" {
		runProxy(*serveProxy, *noSplice, *pipeSize)
		return
	}
	pipeArg = fmt.Sprintf("-pipe-size=%d", *pipeSize)
	if err := run(*rounds, *dur, *rts, *msg, *chunk, *socatBin); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

// runProxy is the child mode: one route, until stdin reaches EOF or SIGTERM.
func runProxy(route string, noSplice bool, pipeSize int) {
	var listen, to string
	for i := range route {
		if route[i] == '=' {
			listen, to = route[:i], route[i+1:]
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := proxy.Listen(context.Background(), []proxy.Route{{Listen: listen, To: to}}, proxy.Options{NoSplice: noSplice, PipeSize: pipeSize, Logger: log})
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
	addr  string   // where the client dials (network:address)
	start []string // child process to start, nil for direct
}

type sample struct{ gbps, rtMicros float64 }

func run(rounds int, dur time.Duration, rts, msgSize, chunk int, socatBin string) error {
	dir, err := os.MkdirTemp("", "proxybench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "server.sock")
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

	self, err := os.Executable()
	if err != nil {
		return err
	}
	ports := freePorts(3)
	variants := []variant{
		{name: "direct-unix", addr: "unix:" + sock},
		{name: "direct-tcp", addr: "tcp:" + tl.Addr().String()},
		{name: "udskit", addr: fmt.Sprintf("tcp:127.0.0.1:%d", ports[0]),
			start: []string{self, "-serve-proxy", fmt.Sprintf("tcp:127.0.0.1:%d=%s", ports[0], sock), pipeArg}},
		{name: "udskit-copy", addr: fmt.Sprintf("tcp:127.0.0.1:%d", ports[1]),
			start: []string{self, "-serve-proxy", fmt.Sprintf("tcp:127.0.0.1:%d=%s", ports[1], sock), "-no-splice"}},
	}
	if _, err := exec.LookPath(socatBin); err == nil {
		variants = append(variants, variant{name: "socat", addr: fmt.Sprintf("tcp:127.0.0.1:%d", ports[2]),
			start: []string{socatBin, fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", ports[2]), "UNIX-CONNECT:" + sock}})
	} else {
		fmt.Fprintln(os.Stderr, "proxybench: socat not found, skipping it")
	}
	for _, v := range variants {
		if v.start == nil {
			continue
		}
		cmd := exec.Command(v.start[0], v.start[1:]...)
		if *proxyProcs > 0 {
			cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", *proxyProcs))
		}
		stdin, _ := cmd.StdinPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", v.name, err)
		}
		defer func() { stdin.Close(); cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
		if err := waitListening(v.addr); err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}

	fmt.Printf("proxybench: %d rounds, stream %v x %d KiB writes, %d round trips of %d B; GOMAXPROCS=%d\n",
		rounds, dur, chunk>>10, rts, msgSize, numCPU())
	res := map[string][]sample{}
	for r := range rounds {
		for _, v := range variants {
			gbps, err := stream(v.addr, dur, chunk)
			if err != nil {
				return fmt.Errorf("%s stream: %w", v.name, err)
			}
			rt, err := pingPong(v.addr, rts, msgSize)
			if err != nil {
				return fmt.Errorf("%s ping-pong: %w", v.name, err)
			}
			res[v.name] = append(res[v.name], sample{gbps, rt})
			fmt.Fprintf(os.Stderr, "round %d %-12s %7.2f Gbit/s %7.2f µs/rt\n", r+1, v.name, gbps, rt)
		}
	}
	med := func(name string, f func(sample) float64) float64 {
		var xs []float64
		for _, s := range res[name] {
			xs = append(xs, f(s))
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	thr := func(n string) float64 { return med(n, func(s sample) float64 { return s.gbps }) }
	lat := func(n string) float64 { return med(n, func(s sample) float64 { return s.rtMicros }) }
	baseT, baseL := thr("direct-tcp"), lat("direct-tcp")
	fmt.Println()
	fmt.Printf("| path | stream Gbit/s | vs direct-tcp | %d B round trip µs | added vs direct-tcp µs |\n", msgSize)
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, v := range variants {
		fmt.Printf("| %s | %.2f | %.2fx | %.1f | %+.1f |\n", v.name, thr(v.name), thr(v.name)/baseT, lat(v.name), lat(v.name)-baseL)
	}
	if _, ok := res["socat"]; ok {
		fmt.Println()
		fmt.Printf("udskit vs socat: throughput %.1fx; added latency %.1f µs vs %.1f µs (%.2f of socat's)\n",
			thr("udskit")/thr("socat"), lat("udskit")-baseL, lat("socat")-baseL, (lat("udskit")-baseL)/(lat("socat")-baseL))
	}
	return nil
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
	network, a := "unix", addr[len("unix:"):]
	if addr[:4] == "tcp:" {
		network, a = "tcp", addr[len("tcp:"):]
	}
	return net.DialTimeout(network, a, 5*time.Second)
}

func stream(addr string, dur time.Duration, chunk int) (float64, error) {
	c, err := dial(addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, chunk)
	buf[0] = 'S'
	start := time.Now()
	var sent uint64
	if _, err := c.Write(buf[:1]); err != nil {
		return 0, err
	}
	for time.Since(start) < dur {
		n, err := c.Write(buf)
		sent += uint64(n)
		if err != nil {
			return 0, err
		}
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	var got uint64
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := binary.Read(c, binary.BigEndian, &got); err != nil {
		return 0, fmt.Errorf("reading the count: %w", err)
	}
	el := time.Since(start)
	if got != sent {
		return 0, fmt.Errorf("server got %d bytes, %d sent", got, sent)
	}
	return float64(got) * 8 / el.Seconds() / 1e9, nil
}

func pingPong(addr string, n, size int) (float64, error) {
	c, err := dial(addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'E'}); err != nil {
		return 0, err
	}
	out, in := make([]byte, size), make([]byte, size)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	// Warm up, then measure.
	for range 200 {
		c.Write(out)
		io.ReadFull(c, in)
	}
	start := time.Now()
	for i := range n {
		binary.LittleEndian.PutUint32(out, uint32(i))
		if _, err := c.Write(out); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return 0, err
		}
		if binary.LittleEndian.Uint32(in) != uint32(i) {
			return 0, errors.New("echo mismatch")
		}
	}
	return float64(time.Since(start).Microseconds()) / float64(n), nil
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

func numCPU() int { return runtime.GOMAXPROCS(0) }

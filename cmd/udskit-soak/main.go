// Command udskit-soak attacks a udskit server the way a hostile local peer
// would, one attack at a time, while a well-behaved client calls echo, and
// prints per attack the good client's p99 and failures, the server's peak
// RSS and fds, and how long until the hostile connections were closed; then
// it kills the server with SIGKILL under load, ten times. scripts/soak.sh
// runs it; docs/reliability.md records its table.
//
// The server is this binary re-run as "udskit-soak server SOCK": the demo
// server of `udskit serve` (demo.Listen with serve's defaults) with shorter
// timeouts so that a run takes minutes, plus a _stats method for its
// goroutine count. Everything happens on a socket in a private temp dir.
package main

import (
	"bufio"
	"bytes"
	"context"
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
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// The server's timeouts (all the same, so every attack has one bound).
const serverTimeout = 5 * time.Second

// minWindow is the shortest window the good client's numbers cover.
const minWindow = 3 * time.Second

func main() {
	if len(os.Args) == 3 && os.Args[1] == "server" {
		os.Exit(runServer(os.Args[2]))
	}
	if len(os.Args) == 3 && os.Args[1] == "good" {
		os.Exit(runGood(os.Args[2]))
	}
	conns := flag.Int("conns", 2000, "hostile connections per slowloris-style attack")
	idle := flag.Int("idle", 5000, "connections of the idle attack")
	only := flag.String("only", "", "run only attacks whose name contains this")
	kills := flag.Int("kills", 10, "SIGKILL cycles under load (0: none)")
	flag.Parse()
	if err := run(*conns, *idle, *only, *kills); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func runServer(sock string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := demo.Listen(context.Background(), sock, demo.ServerOptions{
		MaxConns: uds.DefaultMaxConns(), Logger: log,
		RPC: rpc.ServerOptions{HandshakeTimeout: serverTimeout, FrameTimeout: serverTimeout,
			WriteTimeout: serverTimeout, IdleTimeout: serverTimeout},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rpc.HandleJSON(srv.RPC, "_stats", func(ctx context.Context, req struct{ Free, Dump bool }) (map[string]int, error) {
		if req.Free { // between attacks: each attack's peak RSS starts from a clean heap
			debug.FreeOSMemory() // twice: the first only moves sync.Pool contents to its victim cache
			debug.FreeOSMemory()
		}
		if req.Dump {
			buf := make([]byte, 1<<20)
			os.Stderr.Write(buf[:runtime.Stack(buf, true)])
		}
		return map[string]int{"goroutines": runtime.NumGoroutine(), "conns": srv.ActiveConns()}, nil
	})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	go func() { <-sigs; srv.Close() }()
	fmt.Println("ready")
	if err := srv.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// server is the server process under test.
type server struct {
	cmd  *exec.Cmd
	pid  int
	addr string
	done chan struct{}
}

func startServer(sock string, logf *os.File) (*server, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "server", sock)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, pid: cmd.Process.Pid, addr: "unix:" + sock, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		ready <- l
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(s.done)
	}()
	select {
	case l := <-ready:
		if strings.TrimSpace(l) != "ready" {
			return nil, fmt.Errorf("server said %q (log: %s)", l, logf.Name())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("server not ready after 20s")
	}
	return s, nil
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// rssFds reads the server's resident set (bytes) and open fd count.
func (s *server) rssFds() (rss int64, fds int) {
	if kb, ok := proc.StatusKB(s.pid, "VmRSS"); ok {
		rss = kb << 10
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid)); err == nil {
		fds = len(ents)
	}
	return rss, fds
}

// sampler tracks the server's peak RSS and fds since the last reset.
type sampler struct {
	mu       sync.Mutex
	peakRSS  int64
	peakFds  int
	stop     chan struct{}
	finished chan struct{}
}

func newSampler(s *server) *sampler {
	sm := &sampler{stop: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(sm.finished)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			rss, fds := s.rssFds()
			sm.mu.Lock()
			sm.peakRSS, sm.peakFds = max(sm.peakRSS, rss), max(sm.peakFds, fds)
			sm.mu.Unlock()
			select {
			case <-sm.stop:
				return
			case <-t.C:
			}
		}
	}()
	return sm
}

func (sm *sampler) reset() (rss int64, fds int) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	rss, fds = sm.peakRSS, sm.peakFds
	sm.peakRSS, sm.peakFds = 0, 0
	return rss, fds
}

// goodClient calls echo every 2 ms with a 1 s deadline and records each
// call's start, latency and outcome.
type goodClient struct {
	mu    sync.Mutex
	calls []callRec
	stop  chan struct{}
	done  chan struct{}
}

type callRec struct {
	at  time.Time
	lat time.Duration
	err error
}

// runGood is the good client's process ("udskit-soak good ADDR"): its own
// process, so that the attackers' goroutines do not compete with it for the
// same Go scheduler. It prints one line per call, "START_NS LATENCY_NS ERR",
// until stdin closes.
func runGood(addr string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	payload := bytes.Repeat([]byte("g"), 64)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return 0
		case <-t.C:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := c.CallRaw(ctx, "echo", payload, nil)
		cancel()
		if err == nil && !bytes.Equal(got, payload) {
			err = fmt.Errorf("echo returned %d wrong bytes", len(got))
		}
		msg := "-"
		if err != nil {
			msg = strings.ReplaceAll(err.Error(), "\n", " ")
		}
		fmt.Fprintf(out, "%d %d %s\n", start.UnixNano(), time.Since(start).Nanoseconds(), msg)
		if out.Buffered() > 32<<10 {
			out.Flush()
		}
	}
}

// startGood starts the good client's process and collects its calls.
func startGood(addr string) (*goodClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "good", addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &goodClient{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		<-g.stop
		stdin.Close()
	}()
	go func() {
		defer close(g.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) != 3 {
				continue
			}
			at, _ := strconv.ParseInt(f[0], 10, 64)
			lat, _ := strconv.ParseInt(f[1], 10, 64)
			var err error
			if f[2] != "-" {
				err = errors.New(f[2])
			}
			g.mu.Lock()
			g.calls = append(g.calls, callRec{time.Unix(0, at), time.Duration(lat), err})
			g.mu.Unlock()
		}
		cmd.Wait()
	}()
	return g, nil
}

// window returns the number of calls, failures and the p99 latency of the
// calls started in [from, to).
func (g *goodClient) window(from, to time.Time) (n, failed int, p99 time.Duration, firstErr error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var lats []time.Duration
	for _, c := range g.calls {
		if c.at.Before(from) || !c.at.Before(to) {
			continue
		}
		n++
		if c.err != nil {
			failed++
			if firstErr == nil {
				firstErr = c.err
			}
			continue
		}
		lats = append(lats, c.lat)
	}
	if len(lats) > 0 {
		sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
		p99 = lats[min(len(lats)-1, len(lats)*99/100)]
	}
	return n, failed, p99, firstErr
}

// attack is one hostile scenario: open opens its connections (and starts
// whatever they do); each is watched until the server closes it.
type attack struct {
	name  string
	conns int
	bound time.Duration // the timeout that should close them (plus sweep and grace)
	open  func(h *hostile) error
}

// hostile tracks the hostile connections of one attack.
type hostile struct {
	sock    string
	start   time.Time
	limit   time.Duration
	wg      sync.WaitGroup
	mu      sync.Mutex
	last    time.Time
	stalled time.Duration // writeUntilClosed: longest time from a connection's last completed write to its close
	open    atomic.Int64
	dialErr atomic.Int64
}

func (h *hostile) dial() (net.Conn, error) {
	c, err := net.DialTimeout("unix", h.sock, 5*time.Second)
	if err != nil {
		h.dialErr.Add(1)
	}
	return c, err
}

// closed records that a hostile connection was closed by the server now.
func (h *hostile) closed() {
	h.mu.Lock()
	h.last = time.Now()
	h.mu.Unlock()
	h.open.Add(-1)
}

// readUntilClosed watches c: it discards what the server sends until EOF.
func (h *hostile) readUntilClosed(c net.Conn) {
	h.watch(c, func() error {
		c.SetReadDeadline(h.start.Add(h.limit))
		_, err := io.Copy(io.Discard, c)
		return err
	})
}

// writeUntilClosed runs write on c (never reading) until it fails.
func (h *hostile) writeUntilClosed(c net.Conn, write func() error) {
	h.watch(c, func() error {
		c.SetWriteDeadline(h.start.Add(h.limit))
		last := time.Now()
		for {
			if err := write(); err != nil {
				h.mu.Lock()
				h.stalled = max(h.stalled, time.Since(last))
				h.mu.Unlock()
				return err
			}
			last = time.Now()
		}
	})
}

// watch runs until(c) in a goroutine: the connection counts as closed by the
// server when it returns, and as still open when it ends on our deadline.
func (h *hostile) watch(c net.Conn, until func() error) {
	h.open.Add(1)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer c.Close()
		if ne, ok := until().(net.Error); ok && ne.Timeout() {
			return // still open at the limit: counted as open
		}
		h.closed()
	}()
}

// many dials n connections, sends each first, and watches them.
func (h *hostile) many(n int, first []byte) error {
	for i := 0; i < n; i++ {
		c, err := h.dial()
		if err != nil {
			continue
		}
		if len(first) > 0 {
			c.Write(first)
		}
		h.readUntilClosed(c)
	}
	return nil
}

func helloBytes() []byte {
	var b [frame.HelloSize]byte
	h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame}
	h.Put(b[:])
	return b[:]
}

func requestBytes(id uint32, method string, payloadLen int, payload []byte) []byte {
	head := frame.AppendRequestHead(nil, method)
	h := frame.Header{Type: frame.TypeRequest, ID: id, HeadLen: uint16(len(head)), PayloadLen: uint32(payloadLen)}
	return append(append(h.Append(nil), head...), payload...)
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func attacks(conns, idle int) []attack {
	t := serverTimeout
	// A timeout fires within two sweeper ticks (a quarter each) after it
	// passes; an idle udskit connection also gets 2 s to leave after its goaway.
	bound := t + t/2 + 500*time.Millisecond
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 256)
	return []attack{
		{"garbage", conns, time.Second, func(h *hostile) error { return h.many(conns, garbage) }},
		{"4 GiB length", conns, time.Second, func(h *hostile) error {
			hd := frame.Header{Type: frame.TypeRequest, ID: 1, PayloadLen: 0xFFFFFFFF}
			return h.many(conns, cat(helloBytes(), hd.Append(nil)))
		}},
		{"16 MiB frame, 64 KiB sent, stalled", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 16<<20, make([]byte, 64<<10))))
		}},
		{"slowloris: silent (no hello)", conns, bound, func(h *hostile) error { return h.many(conns, nil) }},
		{"slowloris: half a hello", conns, bound, func(h *hostile) error { return h.many(conns, helloBytes()[:8]) }},
		{"slowloris: half a header", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 10, nil)[:8]))
		}},
		{"slowloris: half a head", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 10, nil)[:frame.HeaderSize+3]))
		}},
		{"slowloris: half a payload", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 1000, make([]byte, 500))))
		}},
		{"slowloris: ndjson after {", conns, bound, func(h *hostile) error { return h.many(conns, []byte("{")) }},
		{"slowloris: ndjson half a line", conns, bound, func(h *hostile) error {
			return h.many(conns, []byte(`{"id":1,"func":"echo","data":"`+strings.Repeat("x", 1000)))
		}},
		{"never reads, sends 1 MiB requests (from stall)", 8, bound, func(h *hostile) error {
			for i := 0; i < 8; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				c.Write(helloBytes())
				payload := bytes.Repeat([]byte("r"), 1<<20)
				id := uint32(0)
				h.writeUntilClosed(c, func() error {
					id++
					_, err := c.Write(requestBytes(id, "echo", len(payload), payload))
					return err
				})
			}
			return nil
		}},
		{"ndjson never reads, 1 MiB lines (from stall)", 8, bound, func(h *hostile) error {
			line := []byte(`{"id":1,"func":"echo","data":"` + strings.Repeat("n", 1<<20) + "\"}\n")
			for i := 0; i < 8; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				h.writeUntilClosed(c, func() error { _, err := c.Write(line); return err })
			}
			return nil
		}},
		{"100k ids in flight", 4, time.Second, func(h *hostile) error {
			sleep := []byte(`{"ms":3000}`)
			for i := 0; i < 4; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				var b []byte
				b = append(b, helloBytes()...)
				for id := uint32(1); id <= 100_000; id++ {
					b = append(b, requestBytes(id, "sleep", len(sleep), sleep)...)
				}
				go c.Write(b) // the server closes once over its in-flight limit
				h.readUntilClosed(c)
			}
			return nil
		}},
		{"deep JSON (100k levels), then idle", 20, bound, func(h *hostile) error {
			deep := strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)
			line := []byte(`{"id":1,"func":"echo","data":` + deep + "}\n")
			for i := 0; i < 20; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				go func() {
					for k := 0; k < 5; k++ {
						if _, err := c.Write(line); err != nil {
							return
						}
					}
				}()
				h.readUntilClosed(c)
			}
			return nil
		}},
		{fmt.Sprintf("%d idle after hello", idle), idle, bound + 2*time.Second, func(h *hostile) error {
			return h.many(idle, helloBytes())
		}},
	}
}

// stats calls the server's _stats method (see runServer).
func stats(addr string, req ...string) (goroutines, conns int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	var m map[string]int
	r := map[string]bool{}
	for _, k := range req {
		r[k] = true
	}
	if err := c.Call(ctx, "_stats", r, &m); err != nil {
		return 0, 0, err
	}
	return m["goroutines"], m["conns"], nil
}

type row struct {
	name               string
	conns, stillOpen   int
	closedAfter, bound time.Duration
	calls, failed      int
	p99                time.Duration
	peakRSS            int64
	peakFds, fdsAfter  int
	baseFds            int
	gorAfter, baseGor  int
	firstErr           error
	dialErrors         int64
}

func run(conns, idle int, only string, kills int) error {
	dir, err := os.MkdirTemp("", "udskit-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "soak.sock")
	srv, err := startServer(sock, logf)
	if err != nil {
		return err
	}
	defer srv.stop()
	good, err := startGood(srv.addr)
	if err != nil {
		return err
	}
	sm := newSampler(srv)
	time.Sleep(time.Second)
	baseGor, _, err := stats(srv.addr)
	if err != nil {
		return err
	}
	_, baseFds := srv.rssFds()
	baseRSS, _ := sm.reset()
	fmt.Printf("baseline: server RSS %.1f MiB, %d fds, %d goroutines; server timeouts %v\n",
		float64(baseRSS)/(1<<20), baseFds, baseGor, serverTimeout)

	var rows []row
	for _, a := range attacks(conns, idle) {
		if only != "" && !strings.Contains(a.name, only) {
			continue
		}
		sm.reset()
		h := &hostile{sock: sock, start: time.Now(), limit: a.bound + 10*time.Second}
		fmt.Fprintf(os.Stderr, "attack: %s ...\n", a.name)
		if err := a.open(h); err != nil {
			return err
		}
		h.wg.Wait()
		if d := time.Until(h.start.Add(minWindow)); d > 0 {
			time.Sleep(d) // enough good calls for a p99
		}
		end := time.Now()
		r := row{name: a.name, conns: a.conns, bound: a.bound, stillOpen: int(h.open.Load()),
			baseFds: baseFds, baseGor: baseGor, dialErrors: h.dialErr.Load()}
		h.mu.Lock()
		if !h.last.IsZero() {
			r.closedAfter = h.last.Sub(h.start)
		}
		if h.stalled > 0 {
			// A never-reading client (writeUntilClosed) first fills the
			// socket buffers; the server's write timeout starts only when
			// its writes stop completing, which is when the client's own
			// writes stop completing too (the server then stops reading
			// it). So the bound counts from each connection's last
			// completed write, not from the attack's start.
			r.closedAfter = h.stalled
		}
		h.mu.Unlock()
		// Back to baseline: wait (up to 10 s) for the server's fds and
		// goroutines to return to where they were.
		deadline := time.Now().Add(10 * time.Second)
		for {
			r.gorAfter, _, _ = stats(srv.addr)
			_, r.fdsAfter = srv.rssFds()
			if r.fdsAfter <= baseFds+2 && r.gorAfter <= baseGor+4 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		r.calls, r.failed, r.p99, r.firstErr = good.window(h.start, end)
		r.peakRSS, r.peakFds = sm.reset()
		if r.gorAfter > baseGor+4 {
			stats(srv.addr, "dump") // into server.log, to see what is left
		}
		rows = append(rows, r)
		stats(srv.addr, "free")
		time.Sleep(200 * time.Millisecond)
		sm.reset()
	}
	close(good.stop)
	<-good.done
	close(sm.stop)
	<-sm.finished
	srv.stop()
	printTable(rows)

	if kills > 0 {
		if err := killCycles(sock, logf, kills); err != nil {
			return err
		}
	}
	return nil
}

func printTable(rows []row) {
	fmt.Println()
	fmt.Println("| attack | hostile conns | all closed after (bound) | still open | good calls | good failures | good p99 | server peak RSS | peak fds | fds after (base) | goroutines after (base) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %.2fs (%.1fs) | %d | %d | %d | %.2fms | %.0f MiB | %d | %d (%d) | %d (%d) |\n",
			r.name, r.conns, r.closedAfter.Seconds(), r.bound.Seconds(), r.stillOpen, r.calls, r.failed,
			float64(r.p99.Microseconds())/1000, float64(r.peakRSS)/(1<<20), r.peakFds,
			r.fdsAfter, r.baseFds, r.gorAfter, r.baseGor)
	}
	for _, r := range rows {
		if r.firstErr != nil {
			fmt.Printf("\n%s: first good-client error: %v\n", r.name, r.firstErr)
		}
		if r.dialErrors > 0 {
			fmt.Printf("\n%s: %d hostile dials failed\n", r.name, r.dialErrors)
		}
	}
}

// killCycles runs 8 callers with 2 s deadlines against a server that is
// killed with SIGKILL and restarted, cycles times, and reports calls that
// returned later than their deadline.
func killCycles(sock string, logf *os.File, cycles int) error {
	srv, err := startServer(sock, logf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := rpc.Dial(ctx, "unix:"+sock, rpc.ClientOptions{Wait: true})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	const deadline = 2 * time.Second
	var calls, failed, late atomic.Int64
	var worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []byte(`{"ms":20}`)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := c.CallRaw(ctx, "sleep", p, nil)
				cancel()
				el := time.Since(start)
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
				if el > deadline+50*time.Millisecond {
					late.Add(1)
				}
				for {
					w := worst.Load()
					if int64(el) <= w || worst.CompareAndSwap(w, int64(el)) {
						break
					}
				}
			}
		}()
	}
	for i := 0; i < cycles; i++ {
		time.Sleep(700 * time.Millisecond)
		srv.cmd.Process.Kill()
		<-srv.done
		if srv, err = startServer(sock, logf); err != nil {
			close(stop)
			wg.Wait()
			return err
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	srv.stop()
	fmt.Printf("\nkill -9 under load: %d cycles, 8 callers, %v deadlines: %d calls, %d failed (expected around kills), %d past their deadline, slowest %v\n",
		cycles, deadline, calls.Load(), failed.Load(), late.Load(), time.Duration(worst.Load()).Round(time.Millisecond))
	if late.Load() > 0 {
		return fmt.Errorf("%d calls returned past their deadline", late.Load())
	}
	return nil
}

package main

import (
	"bufio"
	"context"
	"embed"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// The server's timeouts (all the same, so every attack has one bound).
const serverTimeout = 5 * time.Second

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

// serverKind selects the server under test (-server): "go" (this binary
// re-run as "udskit-soak server SOCK"), "node" (server_node.mjs on the Node
// package's dist/) or "python" (server_python.py on the Python package's
// src/): the same methods (echo, sleep, stream, _stats) and timeouts.
var (
	serverKind = "go"
	nodeDist   = "clients/node/dist"
	// nodeTunables: the glibc setting the Node server runs with (see serverCmd).
	nodeTunables = "glibc.malloc.mmap_threshold=65536"
	// nodeArgs: the node options it runs with. V8 grows its young generation
	// to 2 x 16 MiB under load and keeps it at that size while idle (28 of
	// the 32 MiB a row may keep); --max-semi-space-size=4 caps it at 8 MiB,
	// the setting docs/reliability.md recommends for a Node server whose
	// memory must come back after a burst.
	nodeArgs  = "--max-semi-space-size=4"
	pythonSrc = "clients/python/src"
)

// nodeArgsNow is nodeArgs, or UDSKIT_SOAK_NODE_ARGS when set (even empty):
// node options, space-separated (e.g. "--cpu-prof --cpu-prof-dir=DIR",
// which NODE_OPTIONS refuses).
func nodeArgsNow() string {
	if a, set := os.LookupEnv("UDSKIT_SOAK_NODE_ARGS"); set {
		return a
	}
	return nodeArgs
}

//go:embed server_node.mjs server_python.py
var childScripts embed.FS

// serverCmd returns the command that serves on sock, its scripts written
// next to the socket.
func serverCmd(sock string) (*exec.Cmd, error) {
	script := func(name string) (string, error) {
		b, err := childScripts.ReadFile(name)
		if err != nil {
			return "", err
		}
		p := filepath.Join(filepath.Dir(sock), name)
		return p, os.WriteFile(p, b, 0o600)
	}
	ms := strconv.FormatInt(serverTimeout.Milliseconds(), 10)
	switch serverKind {
	case "go":
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		return exec.Command(exe, "server", sock), nil
	case "node":
		dist, err := filepath.Abs(nodeDist)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(dist, "index.js")); err != nil {
			return nil, fmt.Errorf("-server node needs the built package (cd clients/node && npm ci && npm run build): %w", err)
		}
		p, err := script("server_node.mjs")
		if err != nil {
			return nil, err
		}
		args := append([]string{"--expose-gc"}, strings.Fields(nodeArgsNow())...)
		cmd := exec.Command("node", append(args, p, dist, sock, ms)...)
		cmd.Env = os.Environ()
		if _, set := os.LookupEnv("GLIBC_TUNABLES"); !set {
			// Node's Buffers are malloc'd; glibc raises its mmap threshold as
			// large buffers are freed, after which 64 KiB socket reads and
			// partial frames come from the heap and their pages are kept
			// (RSS 54 -> 215 MiB after 2,000 stalled frames, with the server
			// holding nothing). A fixed threshold keeps them mmap'd, so they
			// go back when freed: the setting docs/reliability.md recommends
			// for a Node server. Set GLIBC_TUNABLES (even empty) to override.
			cmd.Env = append(cmd.Env, "GLIBC_TUNABLES="+nodeTunables)
		}
		return cmd, nil
	case "python":
		src, err := filepath.Abs(pythonSrc)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(src, "udskit", "__init__.py")); err != nil {
			return nil, fmt.Errorf("-server python needs the package source (-python-src): %w", err)
		}
		p, err := script("server_python.py")
		if err != nil {
			return nil, err
		}
		cmd := exec.Command("python3", p, sock, strconv.FormatFloat(serverTimeout.Seconds(), 'f', -1, 64))
		cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
		return cmd, nil
	}
	return nil, fmt.Errorf("-server %q: want go, node or python", serverKind)
}

func startServer(sock string, logf *os.File) (*server, error) {
	cmd, err := serverCmd(sock)
	if err != nil {
		return nil, err
	}
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
	if n, err := proc.CountFDs(s.pid); err == nil {
		fds = n
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

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/udskit/udskit/rpc"
)

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

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// ndjsonLoad calls echo over NDJSON (no goaway, no retry of a refusal: the
// seed-002 client) until ended: oneShot clients open a connection per call
// (connect, one line, one reply, close), persistent ones keep a connection
// and open another when the server closed theirs. A persistent client
// resends a call only when the connection ended before its line could have
// been read (the server closes an NDJSON connection only with no line in
// flight, so this does nothing twice); a one-shot client never resends. Any
// error reply, or a connection ending with the call unanswered for a
// one-shot client, is a failed call.
type ndjsonLoad struct {
	stop                 chan struct{}
	wg                   sync.WaitGroup
	calls, fail, resends atomic.Int64
	mu                   sync.Mutex
	errs                 []string
}

func (l *ndjsonLoad) failed(format string, args ...any) {
	l.fail.Add(1)
	l.mu.Lock()
	if len(l.errs) < 10 {
		l.errs = append(l.errs, fmt.Sprintf(format, args...))
	}
	l.mu.Unlock()
}

// lost reports whether err means the server closed the connection.
func lost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func startNDJSONLoad(path string, oneShot, persistent int) *ndjsonLoad {
	l := &ndjsonLoad{stop: make(chan struct{})}
	stopped := func() bool {
		select {
		case <-l.stop:
			return true
		default:
			return false
		}
	}
	call := func(c net.Conn, r *bufio.Reader, n int) (string, error) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, `{"id":%d,"func":"echo","data":{"n":%d}}`+"\n", n, n); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	check := func(line string, n int) {
		if want := fmt.Sprintf(`{"id":%d,"data":{"n":%d}}`, n, n); strings.TrimSpace(line) != want {
			l.failed("call %d: got %q, want %q", n, line, want)
		}
	}
	for i := range oneShot {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := i * 1_000_000; !stopped(); n++ {
				c, err := net.Dial("unix", path)
				if err != nil {
					l.failed("one-shot connect: %v", err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				l.calls.Add(1)
				line, err := call(c, bufio.NewReader(c), n)
				c.Close()
				if err != nil {
					l.failed("one-shot call %d: %v", n, err)
					continue
				}
				check(line, n)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	for i := range persistent {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var c net.Conn
			var r *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for n := (oneShot + i) * 1_000_000; !stopped(); n++ {
				l.calls.Add(1)
				for attempt := 0; ; attempt++ {
					if c == nil {
						var err error
						if c, err = net.Dial("unix", path); err != nil {
							l.failed("persistent connect: %v", err)
							break
						}
						r = bufio.NewReader(c)
					}
					line, err := call(c, r, n)
					if err == nil {
						check(line, n)
						break
					}
					c.Close()
					c = nil
					if !lost(err) || attempt == 3 {
						l.failed("persistent call %d: %v", n, err)
						break
					}
					l.resends.Add(1)
				}
				// A pause longer than the drain's quiet time (rpc's
				// ndjsonDrainQuiet, 20 ms), so a draining server finds the
				// connection idle; a client that never pauses keeps its
				// connection until the drain deadline.
				time.Sleep(30 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *ndjsonLoad) end() {
	close(l.stop)
	l.wg.Wait()
}

// TestHandoffChainNDJSON: 20 handoffs (udskit serve <-> handoffecho) under
// NDJSON load, one call per connection and persistent connections: no call
// fails. A draining server serves the lines it has read and closes an NDJSON
// connection only with no line in flight; it used to answer a line read
// during the drain with "unavailable: server is shutting down; call not
// processed", which an NDJSON client cannot retry, and to close a connection
// whose first line had just arrived.
func TestHandoffChainNDJSON(t *testing.T) {
	echo := buildHandoffEcho(t)
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "svc.sock")
	ctl := sock + ".handoff"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	udskitCmd := func(args ...string) []string {
		return append([]string{"serve", "-q", "--drain-timeout", "5s"}, args...)
	}
	cur := startInstance(t, scCLI(ctx, udskitCmd(sock, "--handoff-socket", ctl)...))
	cur.line(t, "listening on")
	ld := startNDJSONLoad(sock, 4, 4)
	time.Sleep(200 * time.Millisecond)
	const handoffs = 20
	pastDeadline := 0
	for gen := 1; gen <= handoffs; gen++ {
		var next *instance
		if gen%2 == 1 {
			next = startInstance(t, exec.CommandContext(ctx, echo, "-takeover", "-control", ctl))
		} else {
			next = startInstance(t, scCLI(ctx, udskitCmd("--handoff", "--handoff-socket", ctl)...))
		}
		next.line(t, "took over from pid")
		cur.wait(t, 15*time.Second)
		if strings.Contains(cur.stderr.String(), "drain timeout") {
			pastDeadline++ // connections cut at the deadline: calls may be lost
		}
		cur = next
		time.Sleep(50 * time.Millisecond)
	}
	ld.end()
	calls, fail, resends := ld.calls.Load(), ld.fail.Load(), ld.resends.Load()
	t.Logf("%d handoffs under NDJSON load (4 one-call-per-connection, 4 persistent clients): %d calls, %d failed, %d resent after a close between calls",
		handoffs, calls, fail, resends)
	if fail != 0 {
		t.Errorf("%d of %d NDJSON calls failed; first:\n%s", fail, calls, strings.Join(ld.errs, "\n"))
	}
	if pastDeadline != 0 {
		t.Errorf("%d predecessors reached their drain deadline: an idle NDJSON connection was not closed", pastDeadline)
	}
	if calls < 100 {
		t.Errorf("only %d calls made: the load did not run", calls)
	}
}

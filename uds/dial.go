package uds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"time"
)

// DialOptions configures Dial. The zero value dials once.
type DialOptions struct {
	// Wait retries until the server accepts or ctx ends (the sidecar start-up
	// race): a missing socket (ENOENT), a stale one or a closed port
	// (ECONNREFUSED), a full backlog (EAGAIN) and timeouts are retried.
	// Permission denied, not-a-socket and path-too-long fail at once: waiting
	// would not fix them.
	Wait bool
	// MinBackoff and MaxBackoff bound the retry delay, which doubles from
	// MinBackoff up to MaxBackoff; each delay is jittered to between half and
	// all of its value. Defaults 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// TLS is the client configuration for a tls: address (required there:
	// there is no plaintext fallback): RootCAs, and Certificates for mutual
	// TLS. MinVersion defaults to TLS 1.3 and ServerName to the address's
	// host. See package tlsfiles.
	TLS *tls.Config
	// SSH configures ssh:// addresses.
	SSH SSHOptions
}

// Dial connects to address (see ParseAddr). A bad address is an *AddrError;
// every other failure is a *DialError whose Cause says in words what is wrong
// and whose Err keeps the errno (syscall.ENOENT, ECONNREFUSED, EACCES, ...),
// *PathTooLongError or *NotSocketError for errors.Is and errors.As. When
// Wait gives up because ctx ended, Err matches both ctx.Err() and the last
// attempt's error.
func Dial(ctx context.Context, address string, opts DialOptions) (net.Conn, error) {
	a, err := ParseAddr(address)
	if err != nil {
		return nil, err
	}
	if a.Kind == Passed {
		return nil, &AddrError{Input: address, Reason: "an inherited socket (systemd:, fd:) can be listened on, not dialed"}
	}
	if a.Kind == SSH {
		return dialSSH(ctx, a, opts)
	}
	if a.Kind == TLS && opts.TLS == nil {
		return nil, &DialError{Addr: a, Cause: ErrNoTLSConfig.Error(), Err: ErrNoTLSConfig}
	}
	if err := checkSunPath(a); err != nil {
		return nil, &DialError{Addr: a, Cause: err.Error(), Err: err}
	}
	minB, maxB := opts.MinBackoff, opts.MaxBackoff
	if minB <= 0 {
		minB = 10 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = time.Second
	}
	maxB = max(maxB, minB)
	var d net.Dialer
	backoff := minB
	start := time.Now()
	attempts := 0
	var prev *DialError // the last attempt that failed on its own, not by ctx
	for {
		attempts++
		c, err := d.DialContext(ctx, a.Network(), a.SockaddrName())
		if err == nil {
			if a.Kind == TLS {
				return dialTLS(ctx, a, c, opts.TLS)
			}
			return c, nil
		}
		de := explainDial(a, err)
		if ctx.Err() != nil {
			if prev != nil && errors.Is(de.Err, ctx.Err()) {
				// ctx ended during this attempt: report why the ones
				// before failed, not just "timed out".
				de = prev
			}
			return nil, gaveUp(ctx, de, attempts, start)
		}
		prev = de
		if !opts.Wait || !retryable(de) {
			return nil, de
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, gaveUp(ctx, de, attempts, start)
		case <-t.C:
		}
		backoff = min(backoff*2, maxB)
	}
}

func gaveUp(ctx context.Context, last *DialError, attempts int, start time.Time) *DialError {
	if errors.Is(last.Err, ctx.Err()) {
		return last
	}
	return &DialError{
		Addr:  last.Addr,
		Cause: fmt.Sprintf("gave up after %d attempts in %s; last: %s", attempts, time.Since(start).Round(time.Millisecond), last.Cause),
		Err:   fmt.Errorf("%w; last attempt: %w", ctx.Err(), last.Err),
	}
}

func retryable(de *DialError) bool {
	var nse *NotSocketError
	if errors.As(de.Err, &nse) {
		return false
	}
	for _, e := range []error{syscall.ENOENT, syscall.ECONNREFUSED, syscall.EAGAIN, syscall.ETIMEDOUT, syscall.ECONNRESET} {
		if errors.Is(de.Err, e) {
			return true
		}
	}
	return false
}

// explainDial turns a dial error into a *DialError with a cause in words.
func explainDial(a Addr, err error) *DialError {
	de := &DialError{Addr: a, Err: err}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		de.Err = errno // the message already says connect; keep just the errno
	}
	where := a.SockaddrName()
	switch {
	case errors.Is(err, context.Canceled):
		de.Cause = "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		de.Cause = "timed out"
	case errno == syscall.ENOENT:
		de.Cause = fmt.Sprintf("no socket at %s: the server is not running or listens elsewhere", where)
	case errno == syscall.ECONNREFUSED && a.Kind == Unix:
		if fi, serr := os.Lstat(a.Name); serr == nil && fi.Mode().Type() != fs.ModeSocket {
			nse := &NotSocketError{Path: a.Name, What: describeMode(fi.Mode())}
			de.Cause = nse.Error()
			de.Err = fmt.Errorf("%w: %w", nse, errno)
		} else {
			de.Cause = "stale socket: the file exists but nothing listens"
		}
	case errno == syscall.ECONNREFUSED && a.Kind == Abstract:
		de.Cause = fmt.Sprintf("nothing listens on the abstract name %s", where)
	case errno == syscall.ECONNREFUSED:
		de.Cause = fmt.Sprintf("connection refused: nothing listens on %s", where)
	case errno == syscall.EACCES || errno == syscall.EPERM:
		de.Cause = "permission denied: you need write permission on the socket and search permission on every directory above it"
	case errno == syscall.ENOTDIR:
		de.Cause = fmt.Sprintf("a component of %s is not a directory", where)
	case errno == syscall.EAGAIN:
		de.Cause = "server busy: its listen backlog is full"
	case errno == syscall.ETIMEDOUT:
		de.Cause = "timed out"
	case errno != 0:
		de.Cause = errno.Error()
	default:
		de.Cause = "connect failed"
	}
	return de
}

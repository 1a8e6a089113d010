package spinread

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a unix socketpair as net.Conns.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// writeAfter writes p to c after d.
func writeAfter(c net.Conn, d time.Duration, p []byte) {
	go func() {
		time.Sleep(d)
		c.Write(p)
	}()
}

func TestUnarmedNeverPolls(t *testing.T) {
	a, b := pair(t)
	r := New(a, time.Second, nil)
	if !r.CanPoll() {
		t.Fatal("a unix socket cannot be polled")
	}
	writeAfter(b, 5*time.Millisecond, []byte("x"))
	buf := make([]byte, 8)
	if n, err := r.Read(buf); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if r.Polls.Load() != 0 {
		t.Fatalf("unarmed: %d polls", r.Polls.Load())
	}
}

func TestPollHit(t *testing.T) {
	a, b := pair(t)
	r := New(a, 10*time.Second, nil) // a bound it never reaches
	r.SetBusyGap(0)
	r.Arm()
	writeAfter(b, 2*time.Millisecond, []byte("hello"))
	buf := make([]byte, 8)
	n, err := r.Read(buf)
	if n != 5 || err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if r.Polls.Load() != 1 || r.Hits.Load() != 1 || r.Misses.Load() != 0 {
		t.Fatalf("polls %d hits %d misses %d, want 1 1 0", r.Polls.Load(), r.Hits.Load(), r.Misses.Load())
	}
}

// A poll gives up at its bound, the Read parks and still returns the data,
// and the next waits park without polling, twice as many after each miss in
// a row, until a poll finds its data.
func TestPollGivesUpAndBacksOff(t *testing.T) {
	a, b := pair(t)
	const bound = 200 * time.Microsecond
	r := New(a, bound, nil)
	r.SetBusyGap(0)
	r.Arm()
	buf := make([]byte, 8)
	read := func() {
		t.Helper()
		if n, err := r.Read(buf); n != 1 || err != nil {
			t.Fatalf("Read = %d, %v", n, err)
		}
	}
	// Miss 1: the data comes long after the bound.
	writeAfter(b, 100*time.Millisecond, []byte("1"))
	read()
	if r.Polls.Load() != 1 || r.Misses.Load() != 1 || r.Hits.Load() != 0 {
		t.Fatalf("after a late answer: polls %d misses %d hits %d, want 1 1 0", r.Polls.Load(), r.Misses.Load(), r.Hits.Load())
	}
	// One wait parks without a poll, then miss 2, then two waits park.
	writeAfter(b, time.Millisecond, []byte("2"))
	read()
	if r.Polls.Load() != 1 {
		t.Fatalf("the wait after a miss polled (%d polls)", r.Polls.Load())
	}
	writeAfter(b, 100*time.Millisecond, []byte("3"))
	read()
	if r.Polls.Load() != 2 || r.Misses.Load() != 2 {
		t.Fatalf("polls %d misses %d, want 2 2", r.Polls.Load(), r.Misses.Load())
	}
	for i := range 2 {
		writeAfter(b, time.Millisecond, []byte("4"))
		read()
		if r.Polls.Load() != 2 {
			t.Fatalf("skipped wait %d polled", i)
		}
	}
	// Polls again; data already there: a hit, and the count of misses in a
	// row starts over (the next miss skips one wait, not four).
	b.Write([]byte("5"))
	time.Sleep(time.Millisecond)
	read()
	if r.Polls.Load() != 3 || r.Hits.Load() != 1 {
		t.Fatalf("polls %d hits %d, want 3 1", r.Polls.Load(), r.Hits.Load())
	}
	writeAfter(b, 100*time.Millisecond, []byte("6"))
	read()
	writeAfter(b, time.Millisecond, []byte("7"))
	read()
	b.Write([]byte("8"))
	time.Sleep(time.Millisecond)
	read()
	if r.Polls.Load() != 5 || r.Misses.Load() != 3 {
		t.Fatalf("after a hit, a miss skipped more than one wait: polls %d misses %d, want 5 3", r.Polls.Load(), r.Misses.Load())
	}
}

// A poll ends at once, whatever its bound, on each of the three ways a
// waiter's read can end: the interrupt of a waiter whose ctx ended (a read
// deadline in the past), the connection's Close, and the peer's EOF; Read
// reports it and the poll counts as ended, not missed.
func TestPollEndsOnInterrupt(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(a, b net.Conn)
		want func(error) bool
	}{
		{"deadline", func(a, _ net.Conn) { a.SetReadDeadline(time.Unix(1, 0)) },
			func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
		{"close", func(a, _ net.Conn) { a.Close() },
			func(err error) bool { return errors.Is(err, net.ErrClosed) }},
		{"eof", func(_, b net.Conn) { b.Close() },
			func(err error) bool { return err == io.EOF }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			r := New(a, time.Hour, nil)
			r.SetBusyGap(0) // (a loaded machine must not end the poll)
			r.Arm()
			go func() {
				time.Sleep(20 * time.Millisecond)
				tc.end(a, b)
			}()
			t0 := time.Now()
			_, err := r.Read(make([]byte, 8))
			if !tc.want(err) {
				t.Fatalf("Read = %v", err)
			}
			if d := time.Since(t0); d > 10*time.Second {
				t.Fatalf("Read returned after %v", d)
			}
			if r.Ended.Load() != 1 || r.Misses.Load() != 0 {
				t.Fatalf("ended %d misses %d, want 1 0", r.Ended.Load(), r.Misses.Load())
			}
		})
	}
}

// A poll stops as soon as its lone check fails (another waiter came): the
// Read parks, and returns the data when it comes.
func TestPollStopsWhenCrowded(t *testing.T) {
	a, b := pair(t)
	var others atomic.Bool
	r := New(a, time.Hour, func() bool { return !others.Load() })
	r.SetBusyGap(0)
	r.Arm()
	go func() {
		time.Sleep(20 * time.Millisecond)
		others.Store(true)
		time.Sleep(100 * time.Millisecond)
		b.Write([]byte("x"))
	}()
	if n, err := r.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if r.Crowded.Load() != 1 || r.Hits.Load() != 0 {
		t.Fatalf("crowded %d hits %d, want 1 0", r.Crowded.Load(), r.Hits.Load())
	}
}

func TestNoPollWithoutRawConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r := New(a, time.Second, nil)
	if r.CanPoll() {
		t.Fatal("a net.Pipe end claims it can be polled")
	}
	r.Arm()
	writeAfter(b, time.Millisecond, []byte("x"))
	if n, err := r.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if r.Polls.Load() != 0 {
		t.Fatal("polled a net.Pipe")
	}
	if New(a, 0, nil).CanPoll() {
		t.Fatal("a zero bound polls")
	}
}

func TestDisarm(t *testing.T) {
	a, b := pair(t)
	r := New(a, time.Hour, nil)
	r.SetBusyGap(0) // (a loaded machine must not end the poll)
	r.Arm()
	r.Disarm()
	writeAfter(b, time.Millisecond, []byte("x"))
	if n, err := r.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if r.Polls.Load() != 0 {
		t.Fatal("polled after Disarm")
	}
}

// An armed Read whose lone check already fails does not poll at all (not
// even one non-blocking read): it parks at once.
func TestNoPollWhenNotAlone(t *testing.T) {
	a, b := pair(t)
	r := New(a, time.Hour, func() bool { return false })
	r.SetBusyGap(0)
	r.Arm()
	writeAfter(b, time.Millisecond, []byte("x"))
	if n, err := r.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if r.Polls.Load() != 0 || r.Crowded.Load() != 0 {
		t.Fatalf("polls %d crowded %d with others in flight, want 0 0", r.Polls.Load(), r.Crowded.Load())
	}
}

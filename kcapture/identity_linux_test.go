package kcapture

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
)

// Every exit program is attached before any enter program (and detached
// after them): a syscall that entered between the two would leave its
// thread an entry no exit consumed. With the programs attached in map
// order, the 16 per-syscall tracepoints came out in a random order (all
// eight exits first once in 12,870) and the two raw ones half the time
// enter first.
func TestAttachExitsFirst(t *testing.T) {
	if r := Check(true); !r.OK {
		skipOrFail(t, r)
	}
	// One Open each (16 programs: one order in 12,870 has the exits
	// first), and 5 of the two raw programs (map order changes from one
	// Open to the next).
	opens := map[string]int{AttachTracepoints: 1}
	if runtime.GOARCH == "amd64" {
		opens[AttachRaw] = 5
	}
	for mode, n := range opens {
		for range n {
			c, err := Open(Options{Select: Selection{PID: os.Getpid()}, Attach: mode, RingBytes: 1 << 20})
			if err != nil {
				t.Fatalf("Open %s: %v", mode, err)
			}
			got := c.attached
			c.Close()
			if len(got) != 16 && len(got) != 2 {
				t.Fatalf("%s: attached %q", mode, got)
			}
			for i, name := range got {
				if exit := strings.HasPrefix(name, "exit_") || name == "raw_exit"; exit != (i < len(got)/2) {
					t.Fatalf("%s: attach order %q: every exit program must come before any enter program", mode, got)
				}
			}
		}
	}
}

// A thread's pending entry whose exit was never seen (its syscall entered
// while only the enter program was attached, or the exit program's run
// was skipped) is not taken for the thread's next syscall: the stale
// buffer is not recorded with that syscall's return value as its length.
// This is how TestCaptureKernelCount (cmd/udskit) once saw a 1-byte
// message "c" of an 8-byte write of "count-me". The entry is planted in
// the pending map while the helper's only thread waits in read(0) on a
// pipe (not a socket: no entry of its own); the read then returns and
// must record nothing; the helper's socketpair message after it is
// recorded, once.
func TestStaleEntryIsNotAnotherSyscalls(t *testing.T) {
	type tc struct {
		name, attach string
		kind         Kind
		fd           uint32
	}
	cases := []tc{{"tracepoints/other-syscall", AttachTracepoints, KindWrite, 0}}
	if runtime.GOARCH == "amd64" {
		cases = append(cases,
			tc{"raw/other-syscall", AttachRaw, KindWrite, 0},
			// The same syscall on another fd: the raw exit reads the fd.
			tc{"raw/other-fd", AttachRaw, KindRead, 7})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := startHelper(t, "one-thread", "")
			line, err := h.readLine(30 * time.Second)
			tid, perr := strconv.Atoi(strings.TrimPrefix(line, "tid "))
			if err != nil || perr != nil {
				t.Fatalf("helper said %q (%v)", line, err)
			}
			sink := &fakeSink{}
			r := startCapture(t, Options{Select: Selection{PID: h.pid()}, Attach: c.attach, RingBytes: 1 << 20}, sink)
			// Its thread waits in read(0, ...): syscall 0, first argument 0.
			sysfile := "/proc/" + strconv.Itoa(h.pid()) + "/task/" + strconv.Itoa(tid) + "/syscall"
			testutil.WaitFor(t, "the helper to wait in read(0)", func() bool {
				b, err := os.ReadFile(sysfile)
				return err == nil && strings.HasPrefix(string(b), "0 0x0 ")
			})
			key := uint64(h.pid())<<32 | uint64(tid)
			stale := udscapPending{
				Ts: 1, Buf: 0x1000, Sk: 0x5ca1e, Ino: 1, Fd: c.fd,
				Sotype: SockSeqpacket, Kind: uint8(c.kind),
			}
			if err := r.cap.coll.Maps[udscapMapPendingMap].Put(key, stale); err != nil {
				t.Fatal(err)
			}
			h.say(t, "go") // read(0) returns 3
			h.expect(t, "done")
			onlyReal(t, sink, r.stop(t))
		})
	}
}

// onlyReal checks that the capture recorded the one-thread helpers'
// socketpair message "real", once, and nothing else.
func onlyReal(t *testing.T, sink *fakeSink, st *Stats) {
	t.Helper()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, fc := range sink.conns {
		t.Logf("connection %s: sent %q, received %q, lost %v", fc.info.Comment(), fc.data[ClientToServer].String(), fc.data[ServerToClient].String(), fc.lost)
	}
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections recorded, want the socketpair's only (stats %v)", len(sink.conns), st)
	}
	fc := sink.conns[0]
	if got := fc.msgs[ClientToServer]; len(got) != 1 || string(got[0]) != "real" || fc.lost != [2]int64{} || fc.data[ServerToClient].Len() != 0 {
		t.Fatalf("socketpair: messages %q, lost %v; want one \"real\"", got, fc.lost)
	}
}

// A stale entry (its exit missed) is not taken by the thread's next
// syscall of the same kind when the enter program did not record that one:
// a write to a file, or on a socket that is not selected. The per-syscall
// exit tracepoint knows the kind only, not the fd: it recorded the stale
// buffer with the file write's length, as a message of the stale entry's
// socket (8 bytes marked lost on a second connection). The enter of every
// traced syscall it does not record now drops the thread's entry. The
// entry is planted while the helper's only thread waits in ppoll (not
// traced), for a write on its /dev/null fd; the helper then writes 8
// bytes there, and its socketpair message after it is recorded, once.
// (Raw tracepoints are not tested so: their exit sees every syscall, and
// ppoll's drops the planted entry before the write; there the gap was a
// MSG_PEEK on the stale entry's own fd.)
func TestStaleEntryIsNotTheSameSyscallUnrecorded(t *testing.T) {
	h := startHelper(t, "one-thread-file", "")
	line, err := h.readLine(30 * time.Second)
	var tid, fd int
	if _, serr := fmt.Sscanf(line, "tid %d fd %d", &tid, &fd); err != nil || serr != nil {
		t.Fatalf("helper said %q (%v, %v)", line, err, serr)
	}
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: h.pid()}, Attach: AttachTracepoints, RingBytes: 1 << 20}, sink)
	sysfile := "/proc/" + strconv.Itoa(h.pid()) + "/task/" + strconv.Itoa(tid) + "/syscall"
	ppoll := strconv.Itoa(unix.SYS_PPOLL) + " "
	testutil.WaitFor(t, "the helper to wait in ppoll", func() bool {
		b, err := os.ReadFile(sysfile)
		return err == nil && strings.HasPrefix(string(b), ppoll)
	})
	key := uint64(h.pid())<<32 | uint64(tid)
	stale := udscapPending{
		Ts: 1, Buf: 0x1000, Sk: 0x5ca1e, Ino: 1, Fd: uint32(fd),
		Sotype: SockSeqpacket, Kind: uint8(KindWrite),
	}
	if err := r.cap.coll.Maps[udscapMapPendingMap].Put(key, stale); err != nil {
		t.Fatal(err)
	}
	h.say(t, "go") // ppoll returns; write(fd, "not-sock") returns 8
	h.expect(t, "done")
	onlyReal(t, sink, r.stop(t))
}

// A stale entry is not taken by a later syscall of the same kind whose
// enter run was missed too (two runs missed in a row on one thread: the
// gap forget leaves). The entry is planted while the helper's only
// thread is blocked in write(2) on a pipe, after that write's enter ran:
// at its exit the thread's entry is of its kind but not its own, and was
// recorded with the pipe write's length as a message of the stale
// entry's socket (a second connection, 1 MiB marked lost). A read or
// write syscall now also checks the thread's count of them (task
// io accounting, syscr/syscw): one more than at the entry's enter, or
// the entry is stale.
func TestStaleEntryIsNotALaterSyscallsWhoseEnterWasMissed(t *testing.T) {
	h := startHelper(t, "one-thread-pipe", "")
	line, err := h.readLine(30 * time.Second)
	var tid, rfd int
	if _, serr := fmt.Sscanf(line, "tid %d pipe %d", &tid, &rfd); err != nil || serr != nil {
		t.Fatalf("helper said %q (%v, %v)", line, err, serr)
	}
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: h.pid()}, Attach: AttachTracepoints, RingBytes: 1 << 20}, sink)
	pipe, err := os.Open("/proc/" + strconv.Itoa(h.pid()) + "/fd/" + strconv.Itoa(rfd))
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	h.say(t, "go") // the helper writes 1 MiB to the pipe: blocked once it holds 64 KiB
	sysfile := "/proc/" + strconv.Itoa(h.pid()) + "/task/" + strconv.Itoa(tid) + "/syscall"
	write := strconv.Itoa(unix.SYS_WRITE) + " "
	testutil.WaitFor(t, "the helper to block in write", func() bool {
		b, err := os.ReadFile(sysfile)
		return err == nil && strings.HasPrefix(string(b), write)
	})
	// As the enter of the thread's last write before this one left it:
	// the count of writes that write's exit would have seen.
	acct, err := os.ReadFile("/proc/" + strconv.Itoa(h.pid()) + "/task/" + strconv.Itoa(tid) + "/io")
	var syscw uint64
	for _, l := range strings.Split(string(acct), "\n") {
		if v, ok := strings.CutPrefix(l, "syscw: "); ok {
			syscw, err = strconv.ParseUint(v, 10, 64)
		}
	}
	if err != nil || syscw == 0 {
		t.Fatalf("the helper thread's io accounting %q: no write count (%v)", acct, err)
	}
	key := uint64(h.pid())<<32 | uint64(tid)
	stale := udscapPending{
		Ts: 1, Buf: 0x1000, Sk: 0x5ca1e, Ino: 1, Fd: 99,
		Sotype: SockSeqpacket, Kind: uint8(KindWrite), VfsN: syscw,
	}
	if err := r.cap.coll.Maps[udscapMapPendingMap].Put(key, stale); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(pipe, make([]byte, pipeWrite)); err != nil { // the write returns
		t.Fatal(err)
	}
	h.say(t, "go")
	h.expect(t, "done")
	onlyReal(t, sink, r.stop(t))
}

// Short connections one after the other to one server, as psql makes
// them: the kernel hands a new connection the freed sockets' memory
// (their struct sock addresses, which pair a connection's ends) again and
// again, the ends often swapped. Each connection is its own flow, with its
// own bytes in the right direction and nothing marked lost: before, some
// were written into an earlier flow (4 of 20 psql sessions, one the wrong
// way round), and the per-socket byte counts they inherited marked bytes
// lost that were not.
func TestShortConnectionsReusingSockets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "echo.sock")
	startHelper(t, "echo-server", path)
	cli := startHelper(t, "redial", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{Path: path}}, sink)
	const n = 40
	for i := range n {
		cli.say(t, "@"+path) // a new connection on the same fd; the old one closes
		cli.expect(t, "redialed")
		exchange(t, cli, fmt.Sprintf("q%02d", i))
	}
	st := r.stop(t)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	got := map[string]int{}
	for _, c := range sink.conns {
		got[c.data[ClientToServer].String()+"|"+c.data[ServerToClient].String()]++
		if c.lost != [2]int64{} {
			t.Errorf("connection %s: %v bytes marked lost", c.info.Comment(), c.lost)
		}
	}
	for i := range n {
		if q := fmt.Sprintf("q%02d\n", i); got[q+"|"+q] != 1 {
			t.Errorf("connection %d (%q each way) recorded %d times; all: %v", i, q, got[q+"|"+q], got)
		}
	}
	if len(sink.conns) != n {
		t.Errorf("%d connections recorded, want %d (stats %v)", len(sink.conns), n, st)
	}
}

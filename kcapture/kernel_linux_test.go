package kcapture

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/record"
)

// connOf returns the recorded connection whose ends include pid.
func (s *fakeSink) connOf(pid int) []*fakeConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*fakeConn
	for _, c := range s.conns {
		for _, e := range []End{c.info.Client, c.info.Server} {
			for _, p := range e.Procs {
				if p.PID == pid {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// echoPair starts an echo server and a client connected to it, before any
// capture.
func echoPair(t *testing.T) (srv, cli *helper, path string) {
	path = filepath.Join(t.TempDir(), "echo.sock")
	srv = startHelper(t, "echo-server", path)
	cli = startHelper(t, "client", path)
	return srv, cli, path
}

// exchange sends lines through the client and checks the echoes.
func exchange(t *testing.T, cli *helper, lines ...string) {
	t.Helper()
	for _, l := range lines {
		cli.say(t, l)
		cli.expect(t, l)
	}
}

// A connection opened before the capture: its later traffic is recorded in
// both directions, once each, and both ends' processes are named. Selected
// by the server's socket path, so both ends are in the selection: each byte
// is recorded once, from the sender's write (the kernel program skips the
// receiver's reads); with BothSides the reads are recorded too and the
// Tracker sets those copies aside.
func TestPreexistingConnectionByPath(t *testing.T) {
	for name, attach := range map[string]string{"auto": AttachAuto, "tracepoints": AttachTracepoints} {
		t.Run(name, func(t *testing.T) { testPreexisting(t, attach, false) })
	}
	t.Run("both-sides", func(t *testing.T) { testPreexisting(t, AttachAuto, true) })
}

func testPreexisting(t *testing.T, attach string, bothSides bool) {
	srv, cli, path := echoPair(t)
	exchange(t, cli, "before the capture")
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{Path: path}, Attach: attach, BothSides: bothSides}, sink)
	if attach == AttachTracepoints && !strings.Contains(r.cap.Method(), "syscalls/sys_enter_*") {
		t.Errorf("method %q, want the per-syscall tracepoints", r.cap.Method())
	}
	exchange(t, cli, "first", "second", "third")
	// The client exits: the server reads EOF, which ends client->server.
	cli.in.Close()
	cli.cmd.Wait()
	time.Sleep(100 * time.Millisecond)
	st := r.stop(t)
	t.Logf("stats: %v", st)

	conns := sink.connOf(cli.pid())
	if len(conns) != 1 {
		t.Fatalf("connections with the client pid %d: %d (all: %d)", cli.pid(), len(conns), len(sink.conns))
	}
	c := conns[0]
	want := "first\nsecond\nthird\n"
	if got := c.data[ClientToServer].String(); got != want {
		t.Errorf("client->server %q, want %q", got, want)
	}
	if got := c.data[ServerToClient].String(); got != want {
		t.Errorf("server->client %q, want %q", got, want)
	}
	if !hasPID(c.info.Client, cli.pid()) || !hasPID(c.info.Server, srv.pid()) {
		t.Errorf("ends: client %v server %v; want pids %d and %d", c.info.Client, c.info.Server, cli.pid(), srv.pid())
	}
	if c.info.Path != path {
		t.Errorf("path %q, want %q", c.info.Path, path)
	}
	if !c.ended[ClientToServer] {
		t.Error("the client's exit (EOF at the server) did not end client->server")
	}
	switch {
	case bothSides && st.Tracker.Duplicates != 6:
		t.Errorf("BothSides: %d receive copies set aside, want 6 (3 reads at each end): %+v", st.Tracker.Duplicates, st.Tracker)
	case !bothSides && st.Tracker.Duplicates != 0:
		t.Errorf("both ends selected, yet %d receives reached user space (each byte must be recorded once, when sent): %+v", st.Tracker.Duplicates, st.Tracker)
	}
	for _, other := range sink.conns {
		if other != c {
			t.Errorf("unrelated connection recorded: %s", other.info.Comment())
		}
	}
}

func hasPID(e End, pid int) bool {
	for _, p := range e.Procs {
		if p.PID == pid {
			return true
		}
	}
	return false
}

// --pid selects only that process's sockets: a second, unrelated pair's
// traffic is not recorded.
func TestSelectPID(t *testing.T) {
	_, cliA, _ := echoPair(t)
	srvB, cliB, _ := echoPair(t)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: cliA.pid()}}, sink)
	exchange(t, cliB, "unrelated")
	exchange(t, cliA, "selected")
	exchange(t, cliB, "unrelated again")
	r.stop(t)

	if n := len(sink.connOf(cliB.pid())) + len(sink.connOf(srvB.pid())); n != 0 {
		t.Errorf("the unselected pair was recorded (%d connections)", n)
	}
	conns := sink.connOf(cliA.pid())
	if len(sink.conns) != 1 || len(conns) != 1 {
		t.Fatalf("want exactly the selected connection, got %d (of pid: %d)", len(sink.conns), len(conns))
	}
	c := conns[0]
	if got := c.data[ClientToServer].String(); got != "selected\n" {
		t.Errorf("client->server %q", got)
	}
	if got := c.data[ServerToClient].String(); got != "selected\n" {
		t.Errorf("server->client %q", got)
	}
}

// A 1 MiB write and then 10,000 small writes arrive complete and in order;
// whatever the kernel could not deliver is counted and marked, never
// silently missing.
func TestLargeWriteAndBurst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: cli.pid()}, Snaplen: 2 << 20}, sink)
	cli.say(t, "go")
	cli.expect(t, "done")
	time.Sleep(50 * time.Millisecond)
	st := r.stop(t)
	t.Logf("stats: %v", st)

	if len(sink.conns) != 1 {
		t.Fatalf("%d connections recorded, want 1", len(sink.conns))
	}
	c := sink.conns[0]
	want := blastExpected()
	got := c.data[ClientToServer].Bytes()
	lost := c.lost[ClientToServer]
	if lost == 0 && st.Lost() == 0 {
		if !bytes.Equal(got, want) {
			t.Fatalf("stream differs: got %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
		}
		if n := len(c.msgs[ClientToServer]); n < 1+blastSmall {
			t.Errorf("%d messages, want at least %d", n, 1+blastSmall)
		}
		return
	}
	// Losses must be accounted for: captured + marked lost covers the stream.
	t.Logf("losses reported: %d bytes marked lost, kernel counters %v", lost, st)
	if int64(len(got))+lost != int64(len(want)) && st.Lost() == 0 {
		t.Errorf("captured %d + lost %d != %d and no kernel loss counted", len(got), lost, len(want))
	}
}

// 64 KiB and 8 KiB writes, selected by path: each is one ring-buffer
// record, written out from the ring in place (no copy), and the stream
// arrives byte for byte.
func TestInPlaceWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast64", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{Path: path}}, sink)
	cli.say(t, "go")
	cli.expect(t, "done")
	time.Sleep(50 * time.Millisecond)
	st := r.stop(t)
	t.Logf("stats: %v", st)
	if st.Lost() != 0 {
		t.Fatalf("kernel lost %d events with a 64 MiB ring for 2.3 MiB: %v", st.Lost(), st)
	}
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections recorded, want 1", len(sink.conns))
	}
	want := bytes.Join(blast64Writes(), nil)
	got := sink.conns[0].data[ClientToServer].Bytes()
	if !bytes.Equal(got, want) {
		t.Fatalf("stream differs: got %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
	}
	// A write the socket takes only in part (Go's non-blocking sockets)
	// becomes messages of other sizes, copied: most are whole.
	if st.InPlace == 0 || st.InPlace > 48 {
		t.Errorf("%d messages written in place, want 1 to 48", st.InPlace)
	}
}

// Through a 1 MiB ring, 4.6 MiB of 64 KiB and 8 KiB writes wrap around its
// end many times while records are held for writing in place: records that
// straddle the end come back whole (the ring is mapped twice in a row) and
// the kernel is handed back only space already written.
func TestInPlaceRingWraps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast64-paced", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{Path: path}, RingBytes: 1 << 20}, sink)
	cli.say(t, "go")
	cli.expect(t, "done")
	time.Sleep(50 * time.Millisecond)
	st := r.stop(t)
	t.Logf("stats: %v; in place %d", st, st.InPlace)
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections recorded, want 1", len(sink.conns))
	}
	w := blast64Writes()
	want := bytes.Join(append(w, w...), nil)
	c := sink.conns[0]
	got := c.data[ClientToServer].Bytes()
	if st.Lost() == 0 {
		if !bytes.Equal(got, want) {
			t.Fatalf("stream differs: got %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
		}
	} else {
		// A loaded machine kept the reader away longer than the small
		// ring lasts (80 ms here): what is missing is counted and marked.
		t.Logf("kernel lost %d events", st.Lost())
		if int64(len(got))+c.lost[ClientToServer] != int64(len(want)) {
			t.Fatalf("captured %d + marked lost %d != %d sent", len(got), c.lost[ClientToServer], len(want))
		}
	}
	if st.InPlace == 0 {
		t.Error("no message was written in place")
	}
}

// Messages the ring buffer drops at the end of a capture are followed by no
// message that would reveal them as a gap: the capture marks them lost when
// it ends, from the kernel's byte count of the socket. Here the ring (256
// KiB) fills before Run reads anything: the first writes are captured, the
// rest lost, and what was captured plus what is marked lost is all that was
// sent (it was not before: 25 lost records of 1.35 MB, 0.57 MB of them
// marked nowhere).
func TestLostAtTheEndIsMarked(t *testing.T) {
	if r := Check(true); !r.OK {
		skipOrFail(t, r)
	}
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast64", path)
	c, err := Open(Options{Select: Selection{Path: path}, RingBytes: 256 << 10, Logf: t.Logf})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	cli.say(t, "go")
	cli.expect(t, "done") // every write made while nobody reads the ring
	sink := &fakeSink{}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	st, err := c.Run(ctx, sink, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("stats: %v", st)
	if st.Lost() == 0 {
		t.Fatal("nothing lost with a 256 KiB ring filled before it was read: the test does not test")
	}
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections recorded, want 1", len(sink.conns))
	}
	want := int64(len(bytes.Join(blast64Writes(), nil)))
	fc := sink.conns[0]
	got := int64(fc.data[ClientToServer].Len())
	if got+fc.lost[ClientToServer] != want {
		t.Fatalf("captured %d + marked lost %d = %d, want the %d sent", got, fc.lost[ClientToServer], got+fc.lost[ClientToServer], want)
	}
	if st.Tracker.GapBytes == 0 {
		t.Error("no bytes marked lost as a gap: the end's loss went unmarked")
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Check reports the attach point and, on this kernel, why fentry is not used.
func TestCheckReport(t *testing.T) {
	r := Check(true)
	if !r.OK {
		skipOrFail(t, r)
	}
	t.Logf("method: %s; fentry: %v; notes: %v", r.Method, r.Fentry, r.Notes)
	if r.Method == "" {
		t.Error("no method reported")
	}
	if r.Fentry != nil && !bytes.Contains([]byte(r.Method), []byte(fmt.Sprint(r.Fentry))) {
		t.Errorf("method %q does not say why fentry is not used (%v)", r.Method, r.Fentry)
	}
}

// Seqpacket messages keep their boundaries (one Data call per message, even
// when sent back to back), and an fd passed with SCM_RIGHTS is noted on the
// message that carried it, on the send (sendmsg) and the receive (recvmsg).
func TestSeqpacketBoundariesAndRights(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seq.sock")
	srv := startHelper(t, "seq-server", path)
	cli := startHelper(t, "seq-client", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{Path: path}}, sink)
	cli.say(t, "one two fd:three")
	cli.expect(t, "one two fd:three")
	r.stop(t)

	conns := sink.connOf(srv.pid())
	if len(conns) != 1 {
		t.Fatalf("%d connections of the server, want 1", len(conns))
	}
	c := conns[0]
	if c.info.SockType != SockSeqpacket {
		t.Errorf("socket type %d, want seqpacket", c.info.SockType)
	}
	want := []string{"one", "two", "fd:three"}
	for dir := range 2 {
		var got []string
		for _, m := range c.msgs[dir] {
			got = append(got, string(m))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("direction %d: messages %q, want %q", dir, got, want)
		}
	}
	if len(c.notes) != 1 || !strings.Contains(c.notes[0], "passed 1 fd(s) with SCM_RIGHTS") {
		t.Errorf("notes %q, want one SCM_RIGHTS note", c.notes)
	}
}

// With a ring buffer far too small, events are lost: counted in the stats,
// recorded as drops in the sink, and marked in the flow as bytes not
// captured, never silently missing.
func TestLossIsCountedAndMarked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: cli.pid()}, Snaplen: 2 << 20, RingBytes: 8192}, sink)
	cli.say(t, "go")
	cli.expect(t, "done")
	time.Sleep(50 * time.Millisecond)
	st := r.stop(t)
	t.Logf("stats: %v", st)
	if st.LostChunks == 0 {
		t.Fatal("no chunk lost with an 8 KiB ring buffer and 16 KiB chunks")
	}
	if sink.dropped == 0 {
		t.Error("losses not reported to the sink (Dropped)")
	}
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections", len(sink.conns))
	}
	c := sink.conns[0]
	captured, lost := int64(c.data[ClientToServer].Len()), c.lost[ClientToServer]
	if lost == 0 {
		t.Error("no bytes marked lost in the flow")
	}
	if total := int64(len(blastExpected())); captured+lost > total {
		t.Errorf("captured %d + lost %d > %d written", captured, lost, total)
	}
	// The summary's drop rate: the ring's lost bytes against all seen.
	want := 100 * float64(st.LostBytes+st.FaultBytes) / float64(st.LostBytes+st.FaultBytes+st.Tracker.Bytes)
	if p := st.LossPercent(); p <= 0 || p >= 100 || p != want {
		t.Errorf("LossPercent %.3f, want %.3f (in (0, 100))", p, want)
	}
}

// The same losses written as pcapng through the capture command's sink: the
// file carries the drop count (isb_ifdrop) and the flow's packets say how
// many bytes were not captured before them.
func TestLossMarkedInPcapng(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sink.sock")
	startHelper(t, "sink-server", path)
	cli := startHelper(t, "blast", path)
	var buf bytes.Buffer
	w, err := pcapng.NewWriter(&buf, pcapng.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := startCapture(t, Options{Select: Selection{PID: cli.pid()}, Snaplen: 2 << 20, RingBytes: 8192},
		record.NewPcapSink(w, record.PcapOptions{}))
	cli.say(t, "go")
	cli.expect(t, "done")
	time.Sleep(50 * time.Millisecond)
	st := r.stop(t)
	if st.Lost() == 0 {
		t.Fatal("no loss with an 8 KiB ring buffer")
	}
	rd := pcapng.NewReader(&buf)
	notes := 0
	for {
		p, err := rd.Next()
		if err != nil {
			break
		}
		if strings.Contains(p.Comment, "not captured") {
			notes++
		}
	}
	if rd.Dropped == 0 {
		t.Error("no isb_ifdrop in the file")
	}
	if notes == 0 {
		t.Error("no packet says bytes were not captured before it")
	}
	t.Logf("dropped %d (stats %d), %d packets noting lost bytes", rd.Dropped, st.Lost(), notes)
}

// writev (iovecs, one of them empty) and readv are recorded like write and
// read: the iovecs in order, as one message.
func TestWritevReadv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vec.sock")
	startHelper(t, "echo-server", path)
	cli := startHelper(t, "vec-client", path)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: cli.pid()}}, sink)
	cli.say(t, "go")
	cli.expect(t, "abcde")
	r.stop(t)
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections", len(sink.conns))
	}
	c := sink.conns[0]
	if got := fmt.Sprintf("%q", c.msgs[ClientToServer]); got != `["abcde"]` {
		t.Errorf("client->server messages %s, want one \"abcde\" (writev)", got)
	}
	if got := c.data[ServerToClient].String(); got != "abcde" {
		t.Errorf("server->client %q (readv)", got)
	}
}

// TestReusedFD: the kernel program caches each connected socket's identity
// by (process, fd); a program that closes a connection and connects
// elsewhere on the same fd number must see its new bytes on the new
// connection, never on the old one.
func TestReusedFD(t *testing.T) {
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	startHelper(t, "echo-server", pa)
	startHelper(t, "echo-server", pb)
	cli := startHelper(t, "redial", pa)
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: cli.pid()}}, sink)
	exchange(t, cli, "to-a", "to-a again")
	cli.say(t, "@"+pb)
	cli.expect(t, "redialed")
	exchange(t, cli, "to-b")
	r.stop(t)
	byPath := map[string]string{}
	for _, c := range sink.conns {
		byPath[c.info.Path] += c.data[ClientToServer].String() + "|" + c.data[ServerToClient].String() + ";"
	}
	want := map[string]string{pa: "to-a\nto-a again\n|to-a\nto-a again\n;", pb: "to-b\n|to-b\n;"}
	for p, w := range want {
		if byPath[p] != w {
			t.Errorf("%s: %q, want %q (all: %q)", filepath.Base(p), byPath[p], w, byPath)
		}
	}
	if len(byPath) != 2 {
		t.Errorf("connections by path: %q", byPath)
	}
}

// TestSelectPIDForkedPair: a socketpair shared across fork names its
// creator at both ends (SO_PEERCRED), yet only the creator is selected:
// what it reads from the other process must be recorded (the receive side
// is kept with --pid).
func TestSelectPIDForkedPair(t *testing.T) {
	parent := startHelper(t, "pair-parent", "")
	sink := &fakeSink{}
	r := startCapture(t, Options{Select: Selection{PID: parent.pid()}}, sink)
	exchange(t, parent, "from the child", "again")
	r.stop(t)
	var all string
	for _, c := range sink.conns {
		all += c.data[ClientToServer].String() + c.data[ServerToClient].String()
	}
	if all != "from the child\nagain\n" {
		t.Fatalf("recorded %q from %d connections, want the child's two lines once", all, len(sink.conns))
	}
}

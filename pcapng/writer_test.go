package pcapng

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readAll returns every packet in b (copies of their data).
func readAll(t *testing.T, b []byte) ([]Packet, *Reader) {
	t.Helper()
	r := NewReader(bytes.NewReader(b))
	var out []Packet
	for {
		p, err := r.Next()
		if err == io.EOF {
			return out, r
		}
		if err != nil {
			t.Fatal(err)
		}
		p.Data = append([]byte(nil), p.Data...)
		out = append(out, p)
	}
}

func TestSegmentsFitAnIPPacketAndSnaplenCuts(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Options{Snaplen: 100})
	must(t, err)
	ifc, _ := w.AddInterface("/x.sock", "")
	now := time.Now()
	fl, err := w.OpenFlow(FlowInfo{Interface: ifc}, now)
	must(t, err)
	must(t, fl.Data(ClientToServer, now, make([]byte, 3*MaxSegment+5)))
	must(t, fl.Close(false, now))
	pkts, r := readAll(t, buf.Bytes())
	if r.InterfaceName(0) != "/x.sock" {
		t.Fatalf("interface name %q", r.InterfaceName(0))
	}
	var data int
	for _, p := range pkts {
		if p.OrigLen > 65535 {
			t.Fatalf("packet of %d bytes: over an IP packet", p.OrigLen)
		}
		hl := ipHeaderLen + int(p.Data[ipHeaderLen+12]>>4)*4
		if len(p.Data)-hl > 100 {
			t.Fatalf("packet keeps %d payload bytes, snaplen 100", len(p.Data)-hl)
		}
		data += p.OrigLen - hl
	}
	// 3 handshake + 4 data + 2 FIN + 1 ACK.
	if len(pkts) != 10 || data != 3*MaxSegment+5 {
		t.Fatalf("%d packets carrying %d bytes", len(pkts), data)
	}
	if !p0Time(pkts).Equal(now) {
		t.Fatalf("time %v, want %v", pkts[0].Time, now)
	}
}

func p0Time(p []Packet) time.Time { return p[0].Time }

func TestLostAndDropped(t *testing.T) {
	needTshark(t)
	file := filepath.Join(t.TempDir(), "lost.pcapng")
	f, err := os.Create(file)
	must(t, err)
	w, _ := NewWriter(f, Options{})
	ifc, _ := w.AddInterface("/x.sock", "")
	now := time.Now()
	fl, _ := w.OpenFlow(FlowInfo{Interface: ifc}, now)
	must(t, fl.Data(ClientToServer, now, []byte("abc")))
	must(t, fl.Lost(ClientToServer, 1000))
	must(t, fl.Data(ClientToServer, now, []byte("def")))
	must(t, w.Dropped(ifc, now, 7, "ring buffer overrun"))
	must(t, fl.Close(false, now))
	must(t, w.Close())
	f.Close()
	got := tshark(t, "-r", file, "-Y", "tcp.analysis.lost_segment", "-T", "fields", "-e", "frame.comment")
	if !strings.Contains(got, "1000 bytes not captured") {
		t.Fatalf("lost segment not flagged/commented: %q", got)
	}
	b, _ := os.ReadFile(file)
	_, r := readAll(t, b)
	if r.Dropped != 7 {
		t.Fatalf("dropped %d, want 7", r.Dropped)
	}
}

func TestRotation(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "sync", true: "async"}[async], func(t *testing.T) { testRotation(t, async) })
	}
}

func testRotation(t *testing.T, async bool) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cap.pcapng")
	first, rotate, err := FileRotation(path, 3)
	must(t, err)
	w, err := NewWriter(first, Options{RotateBytes: 200_000, Rotate: rotate, Async: async, AsyncBuffer: 100_000})
	must(t, err)
	ifc, _ := w.AddInterface("/x.sock", "")
	now := time.Now()
	fl, _ := w.OpenFlow(FlowInfo{Interface: ifc}, now)
	for range 20 {
		must(t, fl.Data(ClientToServer, now, make([]byte, 60_000)))
	}
	must(t, fl.Close(false, now))
	must(t, w.Close())
	names, _ := filepath.Glob(path + "*")
	if len(names) != 3 {
		t.Fatalf("files %v, want the newest 3", names)
	}
	for _, n := range names {
		fi, _ := os.Stat(n)
		if fi.Size() > 200_000+70_000 {
			t.Fatalf("%s is %d bytes", n, fi.Size())
		}
		// Each file stands alone (tshark for one mode, the reader for both).
		b, _ := os.ReadFile(n)
		if pk, r := readAll(t, b); len(pk) == 0 || r.InterfaceName(0) != "/x.sock" {
			t.Fatalf("%s: %d packets, interface %q", n, len(pk), r.InterfaceName(0))
		}
		if !async {
			if out := tshark(t, "-r", n, "-T", "fields", "-e", "frame.interface_name"); !strings.Contains(out, "/x.sock") {
				t.Fatalf("%s: %q", n, out)
			}
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("oldest file %s still there: %v", path, err)
	}
}

func TestCreateFileRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	must(t, os.WriteFile(target, []byte("keep"), 0o600))
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(target, link))
	if _, err := CreateFile(link); err == nil {
		t.Fatal("CreateFile wrote through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("target changed")
	}
}

// TestAsyncWritesEverythingInOrder: the background writer loses and
// reorders nothing, and reports a failing output.
func TestAsyncWritesEverythingInOrder(t *testing.T) {
	var sync, async bytes.Buffer
	write := func(out io.Writer, a bool) (*Writer, error) {
		w, err := NewWriter(out, Options{Async: a, AsyncBuffer: 70_000})
		must(t, err)
		ifc, _ := w.AddInterface("/x.sock", "")
		now := time.Unix(1, 0)
		fl, _ := w.OpenFlow(FlowInfo{Interface: ifc}, now)
		for i := range 50 {
			if err := fl.DataNote(Dir(i%2), now, pattern(1000*i, byte(i)), "n"); err != nil {
				return w, err
			}
		}
		return w, fl.Close(false, now)
	}
	for _, a := range []bool{false, true} {
		w, err := write(map[bool]*bytes.Buffer{false: &sync, true: &async}[a], a)
		must(t, err)
		must(t, w.Close())
	}
	if !bytes.Equal(sync.Bytes(), async.Bytes()) {
		t.Fatalf("async output differs: %d vs %d bytes", async.Len(), sync.Len())
	}
	w, _ := write(&failAfter{n: 3}, true)
	if err := w.Close(); err == nil || w.Err() == nil {
		t.Fatal("async write error not reported")
	}
}

func TestWriteErrorIsSticky(t *testing.T) {
	w, err := NewWriter(&failAfter{n: 1}, Options{})
	must(t, err)
	if _, err := w.AddInterface("x", ""); err == nil {
		t.Fatal("no error from a failing writer")
	}
	if _, err := w.OpenFlow(FlowInfo{}, time.Now()); err == nil || w.Err() == nil {
		t.Fatal("error not sticky")
	}
}

type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("disk full")
	}
	f.n--
	return len(p), nil
}

// TestLivePipe: tshark reading the stream from a pipe decodes packets while
// the writer is still running (nothing is held back).
func TestLivePipe(t *testing.T) {
	ts := needTshark(t)
	pr, pw, err := os.Pipe()
	must(t, err)
	cmd := exec.Command(ts, "-l", "-r", "-", "-T", "fields", "-e", "http.request.uri", "-Y", "http.request")
	cmd.Stdin = pr
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	pr.Close()
	defer cmd.Process.Kill()
	w, _ := NewWriter(pw, Options{})
	ifc, _ := w.AddInterface("/x.sock", "")
	fl, _ := w.OpenFlow(FlowInfo{Interface: ifc, ServerPort: 80}, time.Now())
	must(t, fl.Data(ClientToServer, time.Now(), []byte("GET /live HTTP/1.1\r\nHost: x\r\n\r\n")))
	must(t, fl.Data(ServerToClient, time.Now(), []byte("HTTP/1.1 204 No Content\r\n\r\n")))
	line := make(chan string, 1)
	go func() {
		b := make([]byte, 100)
		n, _ := out.Read(b)
		line <- string(b[:n])
	}()
	select {
	case l := <-line:
		if strings.TrimSpace(l) != "/live" {
			t.Fatalf("live tshark printed %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("tshark printed nothing while the capture was open")
	}
	fl.Close(false, time.Now())
	pw.Close()
	cmd.Wait()
}

func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, Options{})
	ifc, _ := w.AddInterface("/x.sock", "d")
	fl, _ := w.OpenFlow(FlowInfo{Interface: ifc, Comment: "c"}, time.Now())
	fl.Data(ClientToServer, time.Now(), []byte("hello"))
	w.Dropped(ifc, time.Now(), 1, "x")
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(bytes.NewReader(b))
		for range 1000 {
			p, err := r.Next()
			if err != nil {
				return
			}
			if len(p.Data) > MaxBlock {
				t.Fatal("packet beyond the block cap")
			}
		}
	})
}

// slowWriter takes 5ms per write, like a disk that cannot keep up.
type slowWriter struct{ bytes.Buffer }

func (s *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(5 * time.Millisecond)
	return s.Buffer.Write(p)
}

// TestDropWhenFull: with a slow output, a dropping writer never waits: it
// writes payload-less packets (headers kept, original length full, a
// comment) and counts the bytes.
func TestDropWhenFull(t *testing.T) {
	out := &slowWriter{}
	w, err := NewWriter(out, Options{Async: true, AsyncBuffer: 200_000, DropWhenFull: true})
	must(t, err)
	ifc, _ := w.AddInterface("/x.sock", "")
	now := time.Now()
	fl, _ := w.OpenFlow(FlowInfo{Interface: ifc}, now)
	start := time.Now()
	const chunks, size = 200, 100_000
	for range chunks {
		must(t, fl.Data(ClientToServer, now, make([]byte, size)))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("200 writes took %v: the writer waited for the slow output", d)
	}
	must(t, fl.Close(false, now))
	must(t, w.Close())
	dropped := w.PayloadDropped()
	if dropped == 0 || dropped >= chunks*size {
		t.Fatalf("dropped %d of %d bytes", dropped, chunks*size)
	}
	pkts, _ := readAll(t, out.Bytes())
	var kept, orig, noted int
	for _, p := range pkts {
		hl := ipHeaderLen + int(p.Data[ipHeaderLen+12]>>4)*4
		kept += len(p.Data) - hl
		orig += p.OrigLen - hl
		if strings.Contains(p.Comment, "could not keep up") {
			noted++
			if len(p.Data) != hl {
				t.Fatal("a dropped packet kept its payload")
			}
		}
	}
	if orig != chunks*size || uint64(orig-kept) != dropped || noted == 0 {
		t.Fatalf("original %d, kept %d, dropped %d, %d noted", orig, kept, dropped, noted)
	}
}

// TestNoResetAfterBothFINs: a flow both sides ended with FIN is closed
// without a RST even when its owner reports an error afterwards (a relay torn
// down after both half-closes); a flow with one side open still gets its RST.
func TestNoResetAfterBothFINs(t *testing.T) {
	count := func(bothFIN bool) (fins, rsts int) {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, Options{})
		must(t, err)
		ifc, _ := w.AddInterface("/x.sock", "")
		now := time.Now()
		fl, err := w.OpenFlow(FlowInfo{Interface: ifc}, now)
		must(t, err)
		must(t, fl.Data(ClientToServer, now, []byte("ping")))
		must(t, fl.Shutdown(ClientToServer, now))
		if bothFIN {
			must(t, fl.Shutdown(ServerToClient, now))
		}
		must(t, fl.Close(true, now))
		pkts, _ := readAll(t, buf.Bytes())
		for _, p := range pkts {
			fl := p.Data[33] // IPv4 (20) + TCP flags at offset 13
			fins += int(fl & 1)
			rsts += int(fl >> 2 & 1)
		}
		return fins, rsts
	}
	if fins, rsts := count(true); fins != 2 || rsts != 0 {
		t.Errorf("both sides FIN'd, then Close(reset): %d FINs, %d RSTs; want 2 and 0", fins, rsts)
	}
	if fins, rsts := count(false); fins != 1 || rsts != 1 {
		t.Errorf("one side open, Close(reset): %d FINs, %d RSTs; want 1 and 1", fins, rsts)
	}
}

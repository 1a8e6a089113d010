package main

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets runCell start this test binary as its server child.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func quick(n, size int) config {
	return config{n: n, size: size, duration: 150 * time.Millisecond, warmup: 30 * time.Millisecond,
		spin: 20 * time.Microsecond, sockConns: 2, full: true}
}

// TestEveryVariantEchoes: each variant, its server a child process, answers
// 16 callers × 64 KiB (and 3 callers at an odd size) with every answer
// compared byte for byte (drive fails a cell on a wrong answer or on no
// answer at all), CPU is measured on both sides, and the report names every
// row. spin gets a longer cell: under load its spinning threads can stall
// each other for 100 ms and more.
func TestEveryVariantEchoes(t *testing.T) {
	odd := quick(3, 5000)
	odd.full = false
	spin := quick(16, 64<<10)
	spin.duration = time.Second
	for _, tc := range []struct {
		cfg      config
		variants string
	}{
		{quick(16, 64<<10), "sock,futex,futexd,futex/c1/s1,futexd/g0"},
		{odd, "sock,futex,futexd"},
		{spin, "spin"},
	} {
		vs, err := parseVariants(tc.variants)
		if err != nil {
			t.Fatal(err)
		}
		cfg := tc.cfg
		res, err := runAll(cfg, vs, 1, nil)
		if err != nil {
			t.Fatalf("%d × %d: %v", cfg.n, cfg.size, err)
		}
		var cli, srv time.Duration
		for i, v := range vs {
			c := res[i][0]
			if c.calls < 1 || c.elapsed < cfg.duration || c.p50 <= 0 || c.cliCPU < 0 || c.srvCPU < 0 {
				t.Errorf("%d × %d, %s: %d calls in %v, p50 %v, CPU %v + %v", cfg.n, cfg.size, v.name, c.calls, c.elapsed, c.p50, c.cliCPU, c.srvCPU)
			}
			cli += c.cliCPU
			srv += c.srvCPU
		}
		// /proc/PID/stat counts 10 ms ticks: summed over the cells.
		if cli <= 0 || srv <= 0 {
			t.Errorf("%s: CPU not measured (client %v, server %v)", tc.variants, cli, srv)
		}
		var b strings.Builder
		writeReport(&b, cfg, vs, res)
		for _, v := range vs {
			if !strings.Contains(b.String(), "| "+v.name+" |") {
				t.Errorf("report has no row %s:\n%s", v.name, b.String())
			}
		}
	}
}

// TestCorruptAnswersAreCaught: a server that flips one byte in the middle
// of every answer fails every variant's cell with errMismatch.
func TestCorruptAnswersAreCaught(t *testing.T) {
	corruptForTest = true
	defer func() { corruptForTest = false }()
	for _, name := range []string{"raw", "sock", "futex", "futexd", "spin"} {
		v, err := parseVariant(name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = runCell(quick(4, 64<<10), v)
		if !errors.Is(err, errMismatch) {
			t.Errorf("%s with a corrupting server: err %v, want %v", name, err, errMismatch)
		}
	}
}

func TestParseVariant(t *testing.T) {
	v, err := parseVariant("futex/c1/s2")
	if err != nil || v.base != "futex" || v.cprocs != 1 || v.sprocs != 2 {
		t.Errorf("futex/c1/s2: %+v, %v", v, err)
	}
	for _, bad := range []string{"ring", "futex/x1", "spin/c0", "raw/c", "sock/s999", "spin/w5", "raw/g1"} {
		if _, err := parseVariant(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	vs, err := parseVariants("spin,spin")
	if err != nil || len(vs) != 2 || vs[0].name != "raw" || vs[1].name != "spin" {
		t.Errorf("spin,spin: %+v, %v (want raw added first, spin once)", vs, err)
	}
	if got := regionSize(16, 64<<10); got%regionAlign != 0 || got < hdrSize+2*16*(64<<10) {
		t.Errorf("regionSize(16, 64 KiB) = %d", got)
	}
	if s, err := parseSize("64k"); err != nil || s != 64<<10 {
		t.Errorf("64k: %d, %v", s, err)
	}
}

func TestMedianAndRatios(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	vs := []variant{{name: "raw", base: "raw"}, {name: "futex", base: "futex"}}
	res := [][]result{
		{{calls: 100, elapsed: time.Second}, {calls: 200, elapsed: time.Second}},
		{{calls: 300, elapsed: time.Second, cliCPU: 3 * time.Millisecond, srvCPU: 3 * time.Millisecond}, {calls: 200, elapsed: time.Second}},
	}
	s := summarize(vs, res)
	if s[1].ratio != 2 || len(s[1].ratios) != 2 || s[1].ratios[0] != 3 || s[1].ratios[1] != 1 {
		t.Errorf("ratios %+v", s[1])
	}
	if c := res[1][0].cpuPerCall(); c != 20*time.Microsecond {
		t.Errorf("cpu per call %v", c)
	}
	res[0][0].cliCPU, res[0][1].cliCPU = 6*time.Millisecond, 8*time.Millisecond // 60 and 40 µs per call
	res[1][1].srvCPU = 4 * time.Millisecond                                     // 20 µs per call
	if s := summarize(vs, res); s[1].cpuRatio != 2.5 {                          // 60/20 and 40/20
		t.Errorf("cpu ratio %v, want 2.5", s[1].cpuRatio)
	}
}

// TestBoundsChecked: a request length past its slot answers nothing (no
// copy past the slot), and an out-of-bounds frame ends the sock server's
// connection without an answer.
func TestBoundsChecked(t *testing.T) {
	r, err := newRing(make([]byte, regionSize(2, 4096)), 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.reqSlot(1), "hello")
	if l := r.echo(1, 5, false); l != 5 || string(r.ansSlot(1)[:5]) != "hello" {
		t.Errorf("echo 5: %d %q", l, r.ansSlot(1)[:5])
	}
	if l := r.echo(0, uint32(r.slot)+1, false); l != 0 {
		t.Errorf("a length past the slot answered %d bytes", l)
	}
	for _, bad := range [][3]uint32{{2, 1, 10}, {0, 1, uint32(r.slot) + 1}, {1 << 31, 1, 1}} {
		got := serveBytes(t, r, frame(bad[0], bad[1], bad[2]))
		if len(got) != 0 {
			t.Errorf("frame %v answered %x", bad, got)
		}
	}
	got := serveBytes(t, r, append(frame(1, 7, 5), frame(0, 8, 0)...))
	want := append(frame(1, 7, 5), frame(0, 8, 0)...)
	if string(got) != string(want) {
		t.Errorf("two good frames: got %x, want %x", got, want)
	}
}

func frame(i, seq, l uint32) []byte {
	var f [frameSize]byte
	binary.LittleEndian.PutUint32(f[:], i)
	binary.LittleEndian.PutUint32(f[4:], seq)
	binary.LittleEndian.PutUint32(f[8:], l)
	return f[:]
}

// serveBytes runs serveFrames on a socketpair fed in (then a half-close)
// and returns what it wrote; it fails the test if serveFrames does not
// return within 5 s.
func serveBytes(t testing.TB, r *ring, in []byte) []byte {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	cli, srv := conn(fds[0]), conn(fds[1])
	defer cli.Close()
	done := make(chan struct{})
	go func() { defer close(done); serveFrames(srv, r, false); srv.Close() }()
	out := make(chan []byte)
	go func() { b, _ := io.ReadAll(cli); out <- b }()
	_, _ = cli.Write(in)
	_ = cli.CloseWrite()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("serveFrames did not return")
	}
	return <-out
}

// FuzzServeFrames: any bytes from a client cost the sock server only its
// connection: no panic, every answer frame names a real caller and a length
// within the slot, and it returns.
func FuzzServeFrames(f *testing.F) {
	f.Add(frame(1, 7, 5))
	f.Add(append(frame(0, 1, 4096), frame(1, 2, 4097)...))
	f.Add([]byte{1, 2, 3})
	r, err := newRing(make([]byte, regionSize(2, 4096)), 2, 4096)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<16 {
			return
		}
		got := serveBytes(t, r, in)
		if len(got)%frameSize != 0 {
			t.Fatalf("answer of %d bytes", len(got))
		}
		for off := 0; off < len(got); off += frameSize {
			i := binary.LittleEndian.Uint32(got[off:])
			l := binary.LittleEndian.Uint32(got[off+8:])
			if i >= uint32(r.n) || l > uint32(r.slot) {
				t.Fatalf("answer frame for caller %d, length %d", i, l)
			}
		}
	})
}

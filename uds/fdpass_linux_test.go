package uds

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
)

// unixPair is testutil.Pair's unix stream pair as *net.UnixConn (SendFDs and
// RecvFDs take those), both closed in t.Cleanup.
func unixPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	c1, c2 := testutil.Pair(t, "unix")
	return c1.(*net.UnixConn), c2.(*net.UnixConn)
}

func devNulls(t testing.TB, n int) []int {
	t.Helper()
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds[i] = fd
	}
	return fds
}

func sameFile(t testing.TB, a, b int) bool {
	var sa, sb unix.Stat_t
	if unix.Fstat(a, &sa) != nil || unix.Fstat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestSendRecvFDs(t *testing.T) {
	a, b := unixPair(t)
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := SendFDs(a, []byte("hello"), []int{int(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, fds, err := RecvFDs(b, buf, 4)
	if err != nil || string(buf[:n]) != "hello" || len(fds) != 1 {
		t.Fatalf("got %q %v %v", buf[:n], fds, err)
	}
	defer unix.Close(fds[0])
	if !sameFile(t, fds[0], int(f.Fd())) {
		t.Fatal("received fd is not the same open file")
	}
	flags, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("received fd not close-on-exec: flags %#x %v", flags, err)
	}
	if err := SendFDs(a, nil, nil); err == nil {
		t.Fatal("empty payload accepted")
	}
	if err := SendFDs(a, []byte("x"), make([]int, MaxFDsPerMessage+1)); !errors.Is(err, ErrTooManyFDs) {
		t.Fatalf("too many fds: %v", err)
	}
	a.Close()
	if _, _, err := RecvFDs(b, buf, 1); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v, want EOF", err)
	}
}

// TestRecvFDsTruncatedClosesAll: more descriptors than the receiver allows is
// ErrFDTruncated, the payload bytes are still returned, and nothing leaks.
func TestRecvFDsTruncatedClosesAll(t *testing.T) {
	a, b := unixPair(t)
	base := testutil.CountFDs(t)
	fds := devNulls(t, 9)
	if err := SendFDs(a, []byte("payload"), fds); err != nil {
		t.Fatal(err)
	}
	closeAll(fds)
	buf := make([]byte, 64)
	n, got, err := RecvFDs(b, buf, 3)
	if !errors.Is(err, ErrFDTruncated) || got != nil || string(buf[:n]) != "payload" {
		t.Fatalf("got n=%d %q fds=%v err=%v", n, buf[:n], got, err)
	}
	if now := testutil.CountFDs(t); now != base {
		t.Fatalf("open fds %d, want %d: a truncated receive leaked", now, base)
	}
}

// TestFDPassingProperty sends random descriptor counts with random payload
// sizes to receivers with random limits (often too small), and checks after
// each round that what arrived is exactly what was sent or an
// ErrFDTruncated, the payload is intact, and no descriptor leaked.
func TestFDPassingProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, uint64(os.Getpid())))
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	a, b := unixPair(t)
	base := testutil.CountFDs(t)
	for i := range rounds {
		count := r.IntN(MaxFDsPerMessage + 3)
		size := 1 + r.IntN(1<<r.IntN(18))
		limit := r.IntN(MaxFDsPerMessage + 1)
		checkRound(t, a, b, r, count, size, limit)
		if now := testutil.CountFDs(t); now != base {
			t.Fatalf("round %d (count %d size %d limit %d): open fds %d, want %d", i, count, size, limit, now, base)
		}
	}
}

func checkRound(t testing.TB, a, b *net.UnixConn, r *rand.Rand, count, size, limit int) {
	fds := devNulls(t, count)
	defer closeAll(fds)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(r.Uint32())
	}
	sendErr := make(chan error, 1)
	go func() { sendErr <- SendFDs(a, payload, fds) }()
	if count > MaxFDsPerMessage {
		if err := <-sendErr; !errors.Is(err, ErrTooManyFDs) {
			t.Fatalf("sending %d fds: %v", count, err)
		}
		return
	}
	got := make([]byte, 0, size)
	buf := make([]byte, 1+r.IntN(size))
	var recvd []int
	var truncated bool
	for len(got) < size {
		n, fds, err := RecvFDs(b, buf, limit)
		switch {
		case errors.Is(err, ErrFDTruncated):
			truncated = true
		case err != nil:
			t.Fatalf("RecvFDs: %v", err)
		}
		got = append(got, buf[:n]...)
		recvd = append(recvd, fds...)
	}
	if err := <-sendErr; err != nil {
		t.Fatalf("SendFDs: %v", err)
	}
	defer closeAll(recvd)
	if !bytes.Equal(got, payload) {
		t.Fatalf("payload of %d bytes garbled", size)
	}
	switch {
	case count > limit && !truncated:
		t.Fatalf("%d fds to a receiver allowing %d: no ErrFDTruncated", count, limit)
	case count <= limit && (truncated || len(recvd) != count):
		t.Fatalf("%d fds, limit %d: got %d, truncated %v", count, limit, len(recvd), truncated)
	}
	for i, fd := range recvd {
		if !sameFile(t, fd, fds[i]) {
			t.Fatalf("fd %d is not the file sent", i)
		}
	}
}

// FuzzFDPassing drives the same round from fuzzer-chosen counts, sizes and
// receiver limits.
func FuzzFDPassing(f *testing.F) {
	f.Add(uint8(1), uint16(5), uint8(1))
	f.Add(uint8(9), uint16(1), uint8(2))
	f.Add(uint8(64), uint16(60000), uint8(0))
	a, b := unixPair(f)
	f.Fuzz(func(t *testing.T, count uint8, size uint16, limit uint8) {
		base := testutil.CountFDs(t)
		r := rand.New(rand.NewPCG(uint64(count), uint64(size)))
		checkRound(t, a, b, r, int(count)%(MaxFDsPerMessage+3), 1+int(size), int(limit)%(MaxFDsPerMessage+1))
		if now := testutil.CountFDs(t); now != base {
			t.Fatalf("open fds %d, want %d", now, base)
		}
	})
}

package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// TestServeShmInPlace: `udskit serve --shm-inplace` has its handlers read
// requests in the client's slot, so the slot stays the server's until the
// handler returns: a 20 KiB `sleep` request of 1.2 s through the region is
// released only after the sleep (at least 1.2 s after it was sent). Without
// the flag the server copies the request out and releases the slot at once,
// well before the answer. With --no-shm the flag is refused with a reason.
func TestServeShmInPlace(t *testing.T) {
	const sleepMS = 1200
	for _, inPlace := range []bool{false, true} {
		sock := filepath.Join(t.TempDir(), "s.sock")
		args := []string{sock}
		if inPlace {
			args = append(args, "--shm-inplace")
		}
		s := scServe(t, args...)
		uc, region := hoardingConn(t, strings.TrimPrefix(s.addr, "unix:"))
		req := fmt.Sprintf(`{"ms":%d,"pad":%q}`, sleepMS, strings.Repeat("p", 20<<10))
		d := shm.Desc{Off: 0, Len: uint32(len(req))}
		if !region.Acquire() {
			t.Fatal("region closed")
		}
		copy(region.Bytes(d), req)
		region.Release()
		var desc [shm.DescSize]byte
		d.Put(desc[:])
		head := frame.AppendRequestHead(nil, "sleep")
		h := frame.Header{Type: frame.TypeRequest, Flags: shm.FlagShm, ID: 1, HeadLen: uint16(len(head)), PayloadLen: shm.DescSize}
		start := time.Now()
		if _, err := uc.Write(append(append(h.Append(nil), head...), desc[:]...)); err != nil {
			t.Fatal(err)
		}
		var released, answered time.Duration
		for answered == 0 {
			var hb [frame.HeaderSize]byte
			if _, err := io.ReadFull(uc, hb[:]); err != nil {
				t.Fatalf("in place %v: %v", inPlace, err)
			}
			fh := frame.ParseHeader(hb[:])
			body := make([]byte, int(fh.HeadLen)+int(fh.PayloadLen))
			if _, err := io.ReadFull(uc, body); err != nil {
				t.Fatal(err)
			}
			switch {
			case uint8(fh.Type) == shm.TypeRelease:
				if string(body[fh.HeadLen:]) != string(desc[:]) {
					t.Fatalf("release of %x, want the request's slot %x", body[fh.HeadLen:], desc)
				}
				released = time.Since(start)
			case fh.Type == frame.TypeResponse && fh.ID == 1:
				ans := body[fh.HeadLen:]
				if fh.Flags&shm.FlagShm != 0 { // in place, the answer is built in a slot of the server's half
					ad, err := shm.ParseDesc(ans)
					if err != nil || !region.Acquire() {
						t.Fatalf("answer descriptor %x: %v", ans, err)
					}
					ans = append([]byte(nil), region.Bytes(ad)...)
					region.Release()
				}
				if string(ans) != fmt.Sprintf(`{"slept_ms":%d}`, sleepMS) {
					t.Fatalf("in place %v: answer %q", inPlace, ans)
				}
				answered = time.Since(start)
			default:
				t.Fatalf("in place %v: frame %+v %q", inPlace, fh, body)
			}
		}
		t.Logf("in place %v: slot released after %v, answer after %v", inPlace, released, answered)
		switch {
		case released == 0:
			t.Fatalf("in place %v: the request's slot was not released before the answer", inPlace)
		case inPlace && released < sleepMS*time.Millisecond:
			t.Fatalf("--shm-inplace: slot released after %v, before the handler returned (%d ms): the request was copied, not read in place", released, sleepMS)
		case !inPlace && released > sleepMS*time.Millisecond/2:
			t.Fatalf("without --shm-inplace: slot released after %v, want at once (the request is copied out)", released)
		}
	}
	r := scRun(t, "", "serve", filepath.Join(t.TempDir(), "x.sock"), "--shm-inplace", "--no-shm")
	if r.code != 2 || !strings.Contains(r.stderr, "--shm-inplace") || !strings.Contains(r.stderr, "--no-shm") {
		t.Fatalf("--shm-inplace --no-shm: exit %d: %s", r.code, r.stderr)
	}
}

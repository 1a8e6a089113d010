package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
)

// TestFindings: a row that meets every target has no finding; each missed
// target is named once.
func TestFindings(t *testing.T) {
	ok := row{name: "ok", conns: 10, closedAfter: 5 * time.Second, bound: 8 * time.Second, calls: 1000,
		p99: 2 * time.Millisecond, peakRSS: 100 << 20, fdsAfter: 12, baseFds: 12, rssAfter: 20 << 20, baseRSS: 8 << 20}
	if f := ok.findings(); len(f) != 0 {
		t.Fatalf("a row within every target: %v", f)
	}
	bad := ok
	bad.failed, bad.p99, bad.peakRSS, bad.stillOpen, bad.fdsAfter, bad.rssAfter = 2, 25*time.Millisecond, 300<<20, 3, 20, 100<<20
	f := strings.Join(bad.findings(), "; ")
	for _, want := range []string{"2 good calls failed", "good p99 25ms", "peak RSS 300 MiB", "3 hostile connections still open", "20 fds after (base 12)", "100 MiB kept after the attack (base 8 MiB)"} {
		if !strings.Contains(f, want) {
			t.Errorf("findings %q lack %q", f, want)
		}
	}
	late := ok
	late.closedAfter = 9 * time.Second
	if f := late.findings(); len(f) != 1 || !strings.Contains(f[0], "closed after 9s, bound 8s") {
		t.Errorf("a late close: %v", f)
	}
}

// TestManyIDs: the 100k-ids attack's buffer (built once, before the clock
// starts) is a hello and then n well-formed sleep requests with ids 1..n.
func TestManyIDs(t *testing.T) {
	b := manyIDs(1000)
	hello := helloBytes()
	if !bytes.Equal(b[:len(hello)], hello) {
		t.Fatal("the buffer does not start with a hello")
	}
	r := frame.NewReader(bytes.NewReader(b[len(hello):]), 0)
	for want := uint32(1); want <= 1000; want++ {
		h, err := r.ReadHeader()
		if err != nil {
			t.Fatalf("request %d: %v", want, err)
		}
		if h.Type != frame.TypeRequest || h.ID != want {
			t.Fatalf("frame %d: type %d id %d", want, h.Type, h.ID)
		}
		if _, err := r.ReadHead(&h); err != nil {
			t.Fatalf("request %d head: %v", want, err)
		}
		if _, err := r.ReadPayload(&h, nil); err != nil {
			t.Fatalf("request %d payload: %v", want, err)
		}
	}
	if _, err := r.ReadHeader(); err == nil {
		t.Fatal("more than 1000 requests")
	}
}

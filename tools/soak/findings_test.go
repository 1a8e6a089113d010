package main

import (
	"strings"
	"testing"
	"time"
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

package uds

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

// TestPolicyRefusalsRateLimited: a flood of refused connects writes a few
// log lines, not one per connect, and the lines count what they left out.
func TestPolicyRefusalsRateLimited(t *testing.T) {
	var logs testutil.Buffer
	path := filepath.Join(t.TempDir(), "s.sock")
	refuse := func(Cred) error { return errors.New("no") }
	l := listenT(t, path, ListenOptions{Policy: refuse, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	testutil.Serve(t, l, testutil.Hangup) // every peer is refused inside Accept
	const n = 3000
	for i := 0; i < n; i++ {
		c, err := Dial(context.Background(), path, DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	testutil.WaitFor(t, "every connect refused", func() bool { return l.Refused() >= n })
	if l.Refused() != n {
		t.Fatalf("Refused() = %d, want %d", l.Refused(), n)
	}
	lines := strings.Count(logs.String(), "peer refused")
	if lines == 0 || lines > 20 {
		t.Fatalf("%d refusal log lines for %d refusals, want a few", lines, n)
	}
	l.Close() // flushes the count of the last second
	total := lines
	for _, m := range regexp.MustCompile(`suppressed=(\d+)`).FindAllStringSubmatch(logs.String(), -1) {
		k, _ := strconv.Atoi(m[1])
		total += k
	}
	if !strings.Contains(logs.String(), "suppressed=") || total < n {
		t.Fatalf("log lines account for %d of %d refusals:\n%s", total, n, logs.String())
	}
}

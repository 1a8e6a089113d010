package socklist

import (
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func TestListUnprivileged(t *testing.T) {
	var snap Snapshot
	testutil.RunJSON(t, testutil.NobodyCmd(t, "list", ""), &snap)
	// pid 1 and this test process belong to root: nobody cannot read their fds.
	if snap.Unreadable == 0 || len(snap.Notes) == 0 || !strings.Contains(strings.Join(snap.Notes, " "), "could not read") {
		t.Fatalf("unprivileged snapshot does not say what it could not see: %+v", snap)
	}
}

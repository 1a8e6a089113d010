package socklist

import (
	"bytes"
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	socks := []Socket{
		{Path: "/run/pg/.s.PGSQL.5432", Type: "stream", State: StateListening, Procs: []Proc{{1, "postgres"}},
			Listen: &ListenInfo{Clients: 2, Accepted: 1, Pending: 1, Backlog: 128, ClientPIDs: []int{7}}},
		{Type: "stream", State: StateConnected, Procs: []Proc{{7, "psql"}}, PeerInode: 9},
		{Path: "@x", Type: "dgram", State: StateUnconnected,
			Procs: []Proc{{1, "a"}, {2, "b"}, {3, "c"}, {4, "d"}, {5, "e"}}},
	}
	var b bytes.Buffer
	WriteTable(&b, socks)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "PATH") {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, want := range []string{
		"2 clients (1 accepted, 1 pending), backlog 128, client pid 7",
		"(unnamed)",
		"1/a,2/b,3/c,+2 more",
	} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("row %d %q lacks %q", i+1, lines[i+1], want)
		}
	}
	if !strings.Contains(lines[2], "peer - (inode 9)") {
		t.Errorf("connection row %q lacks its unknown peer", lines[2])
	}
}

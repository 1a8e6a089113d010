package socklist

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

// The test binary doubles as a client process: helper "connect" connects to
// its argument and holds the connection until the test ends; "list" prints a
// JSON snapshot (used to run List as nobody).
func TestMain(m *testing.M) {
	testutil.Main(m, map[string]testutil.HelperFunc{
		"connect": func(path string) int {
			c, err := net.Dial("unix", path)
			if err != nil {
				fmt.Println("error:", err)
				return 2
			}
			defer c.Close()
			testutil.Ready()
			return 0
		},
		"list": func(string) int {
			snap, err := List(context.Background(), Options{})
			if err != nil {
				fmt.Fprintln(os.Stderr, "error:", err)
				return 2
			}
			return testutil.PrintJSON(snap)
		},
	})
}

// startClient runs a child process that connects to path and holds the connection.
func startClient(t *testing.T, path string) int {
	t.Helper()
	return testutil.StartHelper(t, testutil.HelperCmd(t, "connect", path)).PID
}

func TestListListenerAndPeers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ls.sock")
	l := testutil.ListenUnix(t, path)
	pidA := startClient(t, path)
	pidB := startClient(t, path)
	// Accept one of the two; the other stays in the accept queue.
	testutil.Accept(t, l)

	snap, err := List(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != "sock_diag" {
		t.Fatalf("source %q, notes %v", snap.Source, snap.Notes)
	}
	ls := snap.Select(Filter{Listening: true, Glob: path})
	if len(ls) != 1 {
		t.Fatalf("want 1 listener on %s, got %d", path, len(ls))
	}
	lst := ls[0]
	if lst.Type != "stream" || lst.State != StateListening {
		t.Errorf("listener type/state %s/%s", lst.Type, lst.State)
	}
	if len(lst.Procs) != 1 || lst.Procs[0].PID != os.Getpid() {
		t.Errorf("listener procs %+v, want pid %d", lst.Procs, os.Getpid())
	}
	if lst.Listen == nil || lst.Listen.Clients != 2 || lst.Listen.Accepted != 1 || lst.Listen.Pending != 1 {
		t.Fatalf("listen info %+v, want 2 clients (1 accepted, 1 pending)", lst.Listen)
	}
	if lst.Listen.Backlog <= 0 {
		t.Errorf("backlog %d", lst.Listen.Backlog)
	}
	accepted := lst.Listen.ClientPIDs
	if len(accepted) != 1 || (accepted[0] != pidA && accepted[0] != pidB) {
		t.Errorf("client pids %v, want one of %d %d", accepted, pidA, pidB)
	}
	// The accepted end: same path, connected, peer = the client that was accepted.
	var server *Socket
	for i := range snap.Sockets {
		s := &snap.Sockets[i]
		if s.Path == path && s.State == StateConnected {
			server = s
		}
	}
	if server == nil {
		t.Fatal("accepted end not listed")
	}
	if server.ListenerInode != lst.Inode || len(server.Peer) != 1 || server.Peer[0].PID != accepted[0] {
		t.Errorf("accepted end %+v", server)
	}
	// And from the client's side, the peer is this process.
	client := snap.ByInode(server.PeerInode)
	if client == nil || len(client.Procs) != 1 || client.Procs[0].PID != accepted[0] ||
		len(client.Peer) != 1 || client.Peer[0].PID != os.Getpid() {
		t.Errorf("client end %+v", client)
	}
	if got := snap.Select(Filter{PID: pidA}); len(got) == 0 {
		t.Errorf("--pid %d selected nothing", pidA)
	}
	if got := snap.Select(Filter{PID: pidA, Listening: true}); len(got) != 0 {
		t.Errorf("client pid has no listener, got %+v", got)
	}
	if got := snap.Select(Filter{Glob: "ls.sock", Listening: true}); len(got) != 1 {
		t.Errorf("base-name glob: %d", len(got))
	}
	b, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil || len(back.Sockets) != len(snap.Sockets) {
		t.Fatalf("json round trip: %v", err)
	}
}

func TestSocketpairAndAbstract(t *testing.T) {
	name := fmt.Sprintf("@udskit-socklist-%d", os.Getpid())
	l := testutil.ListenUnix(t, name)
	testutil.DialUnix(t, name)
	testutil.Accept(t, l)
	snap, err := List(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := snap.Select(Filter{Glob: name, Listening: true})
	if len(got) != 1 || got[0].Listen.Accepted != 1 || got[0].Listen.Pending != 0 {
		t.Fatalf("abstract listener: %+v", got)
	}
	if p := got[0].Listen.ClientPIDs; len(p) != 1 || p[0] != os.Getpid() {
		t.Errorf("client pids %v", p)
	}
}

func TestProcNetUnixFallback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fb.sock")
	l := testutil.ListenUnix(t, path)
	testutil.DialUnix(t, path)
	testutil.Accept(t, l)
	snap, err := List(context.Background(), Options{NoDiag: true})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != "/proc/net/unix" {
		t.Fatalf("source %q", snap.Source)
	}
	got := snap.Select(Filter{Glob: path, Listening: true})
	if len(got) != 1 || got[0].Listen.Accepted != 1 || got[0].Procs[0].PID != os.Getpid() {
		t.Fatalf("fallback listener %+v", got)
	}
}

const recordedProcNetUnix = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 100 /run/pg/.s.PGSQL.5432
0000000000000000: 00000003 00000000 00000000 0001 03 101 /run/pg/.s.PGSQL.5432
0000000000000000: 00000003 00000000 00000000 0001 03 102
0000000000000000: 00000002 00000000 00000000 0002 01 103 @abstract name with spaces
0000000000000000: 00000002 00000000 00000000 0005 01 104
garbage line
`

func TestParseProcNetUnixRecorded(t *testing.T) {
	socks, bad, err := ParseProcNetUnix(strings.NewReader(recordedProcNetUnix))
	if err != nil || bad != 1 || len(socks) != 5 {
		t.Fatalf("socks=%d bad=%d err=%v", len(socks), bad, err)
	}
	want := []struct{ path, typ, state string }{
		{"/run/pg/.s.PGSQL.5432", "stream", StateListening},
		{"/run/pg/.s.PGSQL.5432", "stream", StateConnected},
		{"", "stream", StateConnected},
		{"@abstract name with spaces", "dgram", StateUnconnected},
		{"", "seqpacket", StateUnconnected},
	}
	for i, w := range want {
		if s := socks[i]; s.Path != w.path || s.Type != w.typ || s.State != w.state || s.Inode != uint64(100+i) {
			t.Errorf("%d: %+v want %+v", i, s, w)
		}
	}
	owners := map[uint64][]Proc{100: {{1, "postgres"}}, 101: {{2, "postgres"}}, 102: {{3, "psql"}}}
	join(socks, owners, false)
	if l := socks[0].Listen; l == nil || l.Accepted != 1 || l.Clients != 1 {
		t.Errorf("join: %+v", socks[0].Listen)
	}
	if socks[1].ListenerInode != 100 {
		t.Errorf("accepted end not tied to listener: %+v", socks[1])
	}
}

func TestParseDiagRecorded(t *testing.T) {
	// A listener with name, vfs, rqlen (3 pending, backlog 128) and uid, then DONE.
	msg := diagMsg(1, tcpListen, 500,
		attr(unixDiagName, []byte("/run/x.sock")),
		attr(unixDiagVFS, u32s(77, 8<<20|1)),
		attr(unixDiagRQLen, u32s(3, 128)),
		attr(unixDiagUID, u32s(1000)))
	msg = append(msg, diagMsg(1, tcpEstablished, 501, attr(unixDiagPeer, u32s(502)), attr(unixDiagName, []byte("\x00abs")))...)
	done := make([]byte, 20)
	ne.PutUint32(done, 20)
	ne.PutUint16(done[4:], nlmsgDone)
	socks, err := ParseDiagMessages(append(msg, done...))
	if err != errDiagDone || len(socks) != 2 {
		t.Fatalf("%d socks, err %v", len(socks), err)
	}
	l := socks[0]
	if l.Path != "/run/x.sock" || l.Type != "stream" || !l.Listening() || l.Listen.Pending != 3 || l.Listen.Backlog != 128 || l.UID != 1000 || l.VFSIno != 77 {
		t.Errorf("listener %+v %+v", l, l.Listen)
	}
	var snap Snapshot
	snap.Sockets = socks
	if got := snap.ListenersOnFile(77, 8, 1); len(got) != 1 {
		t.Errorf("ListenersOnFile: %d", len(got))
	}
	if c := socks[1]; c.Path != "@abs" || c.PeerInode != 502 || c.State != StateConnected {
		t.Errorf("conn %+v", c)
	}
}

func u32s(v ...uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		ne.PutUint32(b[4*i:], x)
	}
	return b
}

func attr(typ uint16, v []byte) []byte {
	l := 4 + len(v)
	b := make([]byte, (l+3)&^3)
	ne.PutUint16(b, uint16(l))
	ne.PutUint16(b[2:], typ)
	copy(b[4:], v)
	return b
}

func diagMsg(typ, state uint8, ino uint32, attrs ...[]byte) []byte {
	body := make([]byte, unixDiagMsgLen)
	body[0], body[1], body[2] = 1, typ, state
	ne.PutUint32(body[4:], ino)
	for _, a := range attrs {
		body = append(body, a...)
	}
	h := make([]byte, nlmsgHdrLen)
	ne.PutUint32(h, uint32(nlmsgHdrLen+len(body)))
	ne.PutUint16(h[4:], sockDiagByFamily)
	return append(h, body...)
}

func FuzzParseDiagMessages(f *testing.F) {
	f.Add(diagMsg(1, tcpListen, 1, attr(unixDiagName, []byte("/a")), attr(unixDiagRQLen, u32s(1, 2))))
	f.Add([]byte{})
	f.Add(make([]byte, 40))
	f.Fuzz(func(t *testing.T, b []byte) {
		socks, _ := ParseDiagMessages(b)
		if len(socks) > len(b)/(nlmsgHdrLen+unixDiagMsgLen)+1 {
			t.Fatalf("%d sockets from %d bytes", len(socks), len(b))
		}
		join(socks, nil, true)
	})
}

func FuzzParseProcNetUnix(f *testing.F) {
	f.Add(recordedProcNetUnix)
	f.Add("Num\n0: 1 2 3 4 5 6\n")
	f.Fuzz(func(t *testing.T, s string) {
		socks, _, _ := ParseProcNetUnix(strings.NewReader(s))
		for _, x := range socks {
			if x.Type == "" || x.State == "" {
				t.Fatalf("incomplete socket %+v", x)
			}
		}
		join(socks, nil, false)
	})
}

// A server that binds under a private name and links the socket to its
// public path (udskit's Node package does) is listed under the public path,
// with the kernel's name kept in BoundPath, and its accepted ends follow.
func TestListMovedListener(t *testing.T) {
	dir := t.TempDir()
	priv := filepath.Join(dir, ".udskit-priv", "s")
	if err := os.Mkdir(filepath.Dir(priv), 0o700); err != nil {
		t.Fatal(err)
	}
	l := testutil.ListenUnix(t, priv)
	l.SetUnlinkOnClose(false)
	pub := filepath.Join(dir, "pub.sock")
	if err := os.Link(priv, pub); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(priv); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Dir(priv)); err != nil {
		t.Fatal(err)
	}
	startClient(t, pub)
	testutil.Accept(t, l)

	snap, err := List(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := snap.Select(Filter{Glob: "pub.sock"})
	var listener, accepted *Socket
	for i := range got {
		switch {
		case got[i].Listening():
			listener = &got[i]
		case got[i].ListenerInode != 0:
			accepted = &got[i]
		}
	}
	if listener == nil {
		t.Fatalf("no listener listed as %s; sockets under %s: %+v", pub, dir, snap.Select(Filter{Glob: dir + "/*/*"}))
	}
	if listener.Path != pub || listener.BoundPath != priv {
		t.Fatalf("listener path %q bound %q, want %q bound %q", listener.Path, listener.BoundPath, pub, priv)
	}
	if accepted == nil || accepted.Path != pub {
		t.Fatalf("accepted end not listed under %s: %+v", pub, got)
	}
	StatFiles(got)
	if listener.Mode == "" {
		t.Fatalf("no mode for %s: StatFiles did not find the public file", pub)
	}

	// A listener whose file is simply gone (no link anywhere) keeps its name.
	gone := filepath.Join(dir, "gone.sock")
	lg := testutil.ListenUnix(t, gone)
	lg.SetUnlinkOnClose(false)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	snap, err = List(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := snap.ListenersOnPath(gone)
	if len(g) != 1 || g[0].BoundPath != "" {
		t.Fatalf("unlinked listener: %+v, want one under its bound name, no BoundPath", g)
	}
}

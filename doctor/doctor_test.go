package doctor

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// The test binary's "doctor" helper runs the doctor on its argument and
// prints the JSON report: how the checks run as another user (nobody).
func TestMain(m *testing.M) {
	testutil.Main(m, map[string]testutil.HelperFunc{
		"doctor": func(addr string) int {
			return testutil.PrintJSON(Run(context.Background(), addr, Options{}))
		},
	})
}

// shortDir is a temp dir any user may search, with a short path.
func shortDir(t *testing.T) string { return testutil.ShortDir(t, 0o755) }

func quiet() Options {
	return Options{SearchDirs: map[string][]string{}, Root: "/nonexistent-root", SniffTimeout: 100 * time.Millisecond}
}

func wantCause(t *testing.T, r *Report, id string, words ...string) {
	t.Helper()
	if r.Cause != id || r.Connected {
		t.Fatalf("cause %q (connected %v), want %q; checks:\n%s", r.Cause, r.Connected, id, dump(r))
	}
	c := r.Get(id)
	for _, w := range words {
		if !strings.Contains(c.Detail, w) {
			t.Errorf("%s detail %q does not say %q", id, c.Detail, w)
		}
	}
	if c.Fix == "" {
		t.Errorf("%s has no fix", id)
	}
	// Every failed check says what to do, and a fix that points at another
	// line points at one the report printed, in the right direction.
	for i, c := range r.Checks {
		if c.Status == Fail && c.Fix == "" {
			t.Errorf("failed check %s has no fix:\n%s", c.ID, dump(r))
		}
		for _, m := range seeRE.FindAllStringSubmatch(c.Fix, -1) {
			j := slices.IndexFunc(r.Checks, func(o Check) bool { return o.ID == m[1] })
			if j < 0 || (m[2] == "above") != (j < i) || r.Checks[j].Status == Pass {
				t.Errorf("%s's fix points at %q, which is not a failed or warning line %s it:\n%s", c.ID, m[0], m[2], dump(r))
			}
		}
	}
	if strings.Contains(dump(r), "line below") && !seeRE.MatchString(dump(r)) {
		t.Errorf("a fix points at a line in words the test does not know:\n%s", dump(r))
	}
}

var seeRE = regexp.MustCompile(`the ([a-z-]+) line (above|below)`)

func dump(r *Report) string {
	var b strings.Builder
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "  %s %s: %s | %s\n", c.Status, c.ID, c.Detail, c.Fix)
	}
	return b.String()
}

func TestMissingPath(t *testing.T) {
	p := filepath.Join(shortDir(t), "nope.sock")
	r := Run(context.Background(), p, quiet())
	wantCause(t, r, "exists", "does not exist")
	if c := r.Get("connect"); c == nil || !strings.Contains(c.Detail, "ENOENT") {
		t.Errorf("connect line should name ENOENT: %+v", c)
	}
}

func TestMissingDirectory(t *testing.T) {
	d := filepath.Join(shortDir(t), "gone")
	r := Run(context.Background(), filepath.Join(d, "x.sock"), quiet())
	wantCause(t, r, "directories", d, "does not exist")
}

func TestStaleSocket(t *testing.T) {
	p := filepath.Join(shortDir(t), "stale.sock")
	testutil.StaleSocket(t, p)
	r := Run(context.Background(), p, quiet())
	wantCause(t, r, "listener", "stale")
	if c := r.Get("connect"); !strings.Contains(c.Detail, "ECONNREFUSED") {
		t.Errorf("connect: %s", c.Detail)
	}
}

func TestRegularFile(t *testing.T) {
	p := filepath.Join(shortDir(t), "file.sock")
	if err := os.WriteFile(p, []byte("not a socket\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(context.Background(), p, quiet())
	wantCause(t, r, "socket", "regular file")
}

func TestDirectoryInsteadOfSocket(t *testing.T) {
	d := shortDir(t)
	testutil.ListenUnix(t, filepath.Join(d, "inside.sock"))
	r := Run(context.Background(), d, quiet())
	wantCause(t, r, "socket", "is a directory")
	if !strings.Contains(r.Get("socket").Fix, "inside.sock") {
		t.Errorf("fix should list the socket inside: %s", r.Get("socket").Fix)
	}
}

func TestTooLongPath(t *testing.T) {
	p := filepath.Join(shortDir(t), strings.Repeat("x", 120)+".sock")
	r := Run(context.Background(), p, quiet())
	wantCause(t, r, "length", "107 bytes")
}

func TestBadAddress(t *testing.T) {
	r := Run(context.Background(), "udp:1.2.3.4:5", quiet())
	wantCause(t, r, "address", "unknown scheme")
}

func TestHealthyServer(t *testing.T) {
	p := filepath.Join(shortDir(t), "app-udskit.sock")
	l := testutil.ListenUnix(t, p)
	testutil.Serve(t, l, testutil.Greet([]byte("UDSK\x01\x00\x00\x00\x00\x00\x01\x00\x00\x10\x00\x00")))
	r := Run(context.Background(), p, quiet())
	if !r.Connected || r.Cause != "" {
		t.Fatalf("not healthy:\n%s", dump(r))
	}
	order := []string{"address", "length", "directories", "dir-safety", "exists", "socket", "writable", "listener", "connect", "protocol"}
	for _, id := range order {
		if c := r.Get(id); c == nil || c.Status != Pass {
			t.Errorf("%s: %+v", id, c)
		}
	}
	// The checks come in the order, cheapest and most basic first.
	var got []string
	for _, c := range r.Checks {
		got = append(got, c.ID)
	}
	if len(got) < len(order) || strings.Join(got[:len(order)], " ") != strings.Join(order, " ") {
		t.Errorf("checks in order %v, want %v first", got, order)
	}
	if d := r.Get("listener").Detail; !strings.Contains(d, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("listener line does not name this pid: %s", d)
	}
	if r.Protocol != "udskit" {
		t.Errorf("protocol %q", r.Protocol)
	}
}

// A real udskit server does not speak first: the doctor sends the frame
// package's client hello (chosen by the name) and reads the server's hello.
func TestRealUdskitServerProbed(t *testing.T) {
	p := filepath.Join(shortDir(t), "app-udskit.sock")
	s := rpc.NewServer(rpc.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { s.Close() })
	testutil.Serve(t, testutil.ListenUnix(t, p), s.ServeConn)
	r := Run(context.Background(), p, quiet())
	c := r.Get("protocol")
	if !r.Connected || r.Protocol != "udskit" || c.Status != Pass ||
		!strings.Contains(c.Detail, fmt.Sprintf("protocol version %d", frame.Version)) || !strings.Contains(c.Detail, "max frame") {
		t.Fatalf("protocol %q:\n%s", r.Protocol, dump(r))
	}
}

func TestHealthyHTTPByName(t *testing.T) {
	d := shortDir(t)
	p := filepath.Join(d, "docker.sock")
	testutil.Serve(t, testutil.ListenUnix(t, p), func(c net.Conn) {
		c.Read(make([]byte, 512))
		c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK"))
	})
	r := Run(context.Background(), p, quiet())
	if !r.Connected || r.Protocol != "http" {
		t.Fatalf("protocol %q:\n%s", r.Protocol, dump(r))
	}
	if c := r.Get("service"); c == nil || c.Status != Pass || !strings.Contains(c.Detail, "DOCKER_HOST=unix://"+p) {
		t.Errorf("service: %+v", c)
	}
}

func TestSilentServerUnknownName(t *testing.T) {
	p := filepath.Join(shortDir(t), "quiet.sock")
	testutil.Serve(t, testutil.ListenUnix(t, p), testutil.Discard)
	r := Run(context.Background(), p, quiet())
	if !r.Connected || r.Get("protocol").Status != Skip || r.Protocol != "" {
		t.Fatalf("%s", dump(r))
	}
}

func TestRedisHealthy(t *testing.T) {
	rs := testsvc.StartRedis(t, testsvc.RedisOptions{})
	r := Run(context.Background(), rs.Socket, quiet())
	if !r.Connected || r.Protocol != "redis" {
		t.Fatalf("protocol %q:\n%s", r.Protocol, dump(r))
	}
}

func TestAbstract(t *testing.T) {
	name := fmt.Sprintf("@doctor-test-%d", os.Getpid())
	r := Run(context.Background(), name, quiet())
	wantCause(t, r, "listener", "nothing listens")
	testutil.Serve(t, testutil.ListenUnix(t, name), testutil.Discard)
	if r := Run(context.Background(), name, quiet()); !r.Connected {
		t.Fatalf("%s", dump(r))
	}
}

func TestContainerEvidence(t *testing.T) {
	root := t.TempDir()
	if in, _ := Container(root); in {
		t.Fatal("empty root is not a container")
	}
	os.MkdirAll(filepath.Join(root, "proc/1"), 0o755)
	os.WriteFile(filepath.Join(root, "proc/1/cgroup"), []byte("0::/kubepods/besteffort/pod1\n"), 0o644)
	in, how := Container(root)
	if !in || !strings.Contains(how, "kubepods") {
		t.Fatalf("%v %q", in, how)
	}
	// With container evidence, a missing socket gets the cross-kernel hint,
	// whose fix listens on loopback only, never on every interface.
	opts := quiet()
	opts.Root = root
	dir := shortDir(t)
	r := Run(context.Background(), filepath.Join(dir, "x.sock"), opts)
	if c := r.Get("kernel"); c == nil || c.Status != Warn || !strings.Contains(c.Detail, "one kernel") ||
		!strings.Contains(c.Fix, "--listen tcp:127.0.0.1:PORT") || strings.Contains(c.Fix, "0.0.0.0") {
		t.Fatalf("kernel hint: %+v", c)
	}
	// A stale socket (no listener on this kernel): the same hint.
	testutil.StaleSocket(t, filepath.Join(dir, "stale.sock"))
	if r := Run(context.Background(), filepath.Join(dir, "stale.sock"), opts); r.Get("kernel") == nil {
		t.Errorf("stale socket in a container: no kernel hint:\n%s", dump(r))
	}
	// Only when relevant: a regular file or a too-long path is not the
	// kernel's doing.
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	for _, p := range []string{filepath.Join(dir, "file"), filepath.Join(dir, strings.Repeat("y", 120))} {
		if r := Run(context.Background(), p, opts); r.Get("kernel") != nil {
			t.Errorf("%s: a kernel hint that does not apply:\n%s", filepath.Base(p), dump(r))
		}
	}
}

func TestPostgresInAnotherDirectory(t *testing.T) {
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})
	empty := shortDir(t)
	asked := filepath.Join(empty, ".s.PGSQL.5432")
	opts := quiet()
	opts.SearchDirs = map[string][]string{"postgresql": {empty, pg.Dir}}
	r := Run(context.Background(), asked, opts)
	wantCause(t, r, "exists")
	c := r.Get("service")
	if c == nil || c.Status != Warn || !strings.Contains(c.Detail, pg.SocketPath()) ||
		!strings.Contains(c.Fix, "host="+pg.Dir) || !strings.Contains(c.Fix, "-h "+pg.Dir) {
		t.Fatalf("service hint: %+v\n%s", c, dump(r))
	}
	if len(r.Alternatives) == 0 || r.Alternatives[0].Path != pg.SocketPath() ||
		len(r.Alternatives[0].Procs) == 0 || r.Alternatives[0].Procs[0].Command != "postgres" {
		t.Errorf("alternatives %+v", r.Alternatives)
	}
	// And the real socket passes, with the protocol recognised.
	r = Run(context.Background(), pg.SocketPath(), opts)
	if !r.Connected || r.Protocol != "postgresql" || r.Get("service").Status != Pass {
		t.Fatalf("%s", dump(r))
	}
}

// runAsNobody runs the doctor on addr as nobody, by re-running this test binary.
func runAsNobody(t *testing.T, addr string) *Report {
	t.Helper()
	var r Report
	testutil.RunJSON(t, testutil.NobodyCmd(t, "doctor", addr), &r)
	return &r
}

func TestUnsearchableDirectoryAsNobody(t *testing.T) {
	locked := filepath.Join(shortDir(t), "locked")
	if err := os.Mkdir(locked, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(locked, "app.sock")
	testutil.Serve(t, testutil.ListenUnix(t, p), testutil.Discard)
	r := runAsNobody(t, p)
	wantCause(t, r, "directories", locked, "drwx------", "root:root", "not searchable", "nobody")
	if !strings.Contains(r.Get("connect").Detail, "EACCES") {
		t.Errorf("connect: %s", r.Get("connect").Detail)
	}
}

func TestSocketWithoutWritePermissionAsNobody(t *testing.T) {
	p := filepath.Join(shortDir(t), "ro.sock")
	testutil.Serve(t, testutil.ListenUnix(t, p), testutil.Discard)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	r := runAsNobody(t, p)
	wantCause(t, r, "writable", "srw-r--r--", "not writable", "nobody")
	// The listener is root's: nobody cannot name it, and says so.
	if c := r.Get("listener"); c.Status != Pass || !strings.Contains(c.Detail, "cannot see") {
		t.Errorf("listener: %+v", c)
	}
	if !strings.Contains(r.Get("connect").Detail, "EACCES") {
		t.Errorf("connect: %s", r.Get("connect").Detail)
	}
}

func TestIdentifyRecorded(t *testing.T) {
	mysql := append([]byte{0x4a, 0, 0, 0, 10}, []byte("10.11.6-MariaDB\x00rest")...)
	cases := []struct {
		probe string
		in    []byte
		want  string
	}{
		{"", mysql, "mysql"},
		{"", []byte("SSH-2.0-OpenSSH_9.2\r\n"), "ssh"},
		{"http", []byte("HTTP/1.1 200 OK\r\n"), "http"},
		{"postgres", []byte("N"), "postgresql"},
		{"", []byte("N"), ""},
		{"redis", []byte("-NOAUTH Authentication required.\r\n"), "redis"},
		{"", []byte("UDSK\x01"), "udskit"},
		{"", []byte("UDSK\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00"), "udskit"},
		{"", []byte{1, 2, 3}, ""},
	}
	for _, c := range cases {
		if got, _ := Identify(c.probe, c.in); got != c.want {
			t.Errorf("Identify(%q, %q) = %q, want %q", c.probe, c.in, got, c.want)
		}
	}
	if _, d := Identify("", []byte("UDSK\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00")); !strings.Contains(d, "not a valid hello") {
		t.Errorf("version-0 hello: %q", d)
	}
	if _, d := Identify("", udskitHello()); !strings.Contains(d, "max frame 65536 bytes") {
		t.Errorf("our own probe does not parse as a hello: %q", d)
	}
}

func FuzzIdentify(f *testing.F) {
	f.Add("postgres", []byte("S"))
	f.Add("", []byte("HTTP/1.1 200 OK\r\n"))
	f.Add("", []byte{0x4a, 0, 0, 0, 10, 'x', 0})
	f.Fuzz(func(t *testing.T, probe string, b []byte) {
		_, detail := Identify(probe, b)
		if len(detail) > 1024 {
			t.Fatalf("detail of %d bytes", len(detail))
		}
	})
}

func TestWorldWritableDirectoryWarns(t *testing.T) {
	d := shortDir(t)
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(d, "app.sock")
	l := testutil.ListenUnix(t, p)
	testutil.Serve(t, l, testutil.Echo)
	r := Run(context.Background(), p, quiet())
	c := r.Get("dir-safety")
	if c == nil || c.Status != Warn || !strings.Contains(c.Detail, "no sticky bit") || !strings.Contains(c.Fix, "chmod o-w "+d) {
		t.Fatalf("want a dir-safety WARN with the fix; checks:\n%s", dump(r))
	}
	if !r.Connected || r.Cause != "" {
		t.Errorf("a warning is not a failure; checks:\n%s", dump(r))
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if c := Run(context.Background(), p, quiet()).Get("dir-safety"); c == nil || c.Status != Pass {
		t.Errorf("0755 dir: %+v", c)
	}
}

// TestUdskitShmLine: a real udskit server (its name says udskit, so the
// doctor sends a hello) with a Go client using shared memory: the shm line
// reports the region, its fill level and no waits, and the report carries
// the statistics.
func TestUdskitShmLine(t *testing.T) {
	p := filepath.Join(shortDir(t), "app-udskit.sock")
	s := rpc.NewServer(rpc.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	t.Cleanup(func() { s.Close() })
	testutil.Serve(t, testutil.ListenUnix(t, p), s.ServeConn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, p, rpc.ClientOptions{Conns: 1, LargeConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		if _, err := c.CallRaw(ctx, "echo", make([]byte, 64<<10), nil); err != nil {
			t.Fatal(err)
		}
	}
	r := Run(ctx, p, quiet())
	sh := r.Get("shm")
	if sh == nil || sh.Status != Pass || r.Stats == nil || r.Stats.Shm.Conns != 1 || r.Stats.Shm.Sent != 2 {
		t.Fatalf("shm line %+v, stats %+v:\n%s", sh, r.Stats, dump(r))
	}
	for _, w := range []string{"shared memory: 1 connection, ", "% full (", " of 32 MiB in use), 0 waits; 2 payloads sent and 2 received"} {
		if !strings.Contains(sh.Detail, w) {
			t.Errorf("shm detail %q lacks %q", sh.Detail, w)
		}
	}
	var b strings.Builder
	r.WriteText(&b)
	if !strings.Contains(b.String(), "shared memory: 1 connection") {
		t.Errorf("text report lacks the shm line:\n%s", b.String())
	}

	// --no-shm on the server: the line says it is off.
	p2 := filepath.Join(shortDir(t), "off-udskit.sock")
	s2 := rpc.NewServer(rpc.ServerOptions{NoShm: true, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { s2.Close() })
	testutil.Serve(t, testutil.ListenUnix(t, p2), s2.ServeConn)
	r = Run(ctx, p2, quiet())
	if sh := r.Get("shm"); sh == nil || sh.Status != Pass || !strings.Contains(sh.Detail, "shared memory is off on this server") {
		t.Fatalf("shm line %+v:\n%s", sh, dump(r))
	}
}

// TestShmVerdicts: each state of the statistics and its words; waits, a
// nearly full half and payloads over a half warn with a fix.
func TestShmVerdicts(t *testing.T) {
	unix := uds.Addr{Kind: uds.Unix, Name: "/run/app.sock"}
	on := func(sh rpc.ShmServerStats) rpc.ServerStats {
		sh.Enabled = true
		return rpc.ServerStats{Conns: 4, Shm: sh}
	}
	for _, c := range []struct {
		st     rpc.ServerStats
		a      uds.Addr
		status Status
		words  []string
	}{
		{rpc.ServerStats{Conns: 2}, unix, Pass, []string{"shared memory is off"}},
		{on(rpc.ShmServerStats{Sent: 5, Received: 4}), unix, Pass, []string{"on, no connection uses it now", "5 payloads sent and 4 received", "0 waits"}},
		{on(rpc.ShmServerStats{Sent: 1234567, Received: 999, Waits: 1000}), unix, Warn, []string{"1,234,567 payloads sent and 999 received", "1,000 waits"}},
		{on(rpc.ShmServerStats{}), uds.Addr{Kind: uds.TCP, Name: "127.0.0.1:1"}, Pass, []string{"local unix sockets only"}},
		{on(rpc.ShmServerStats{Conns: 3, InUse: 24 << 20, Capacity: 96 << 20}), unix, Pass, []string{"shared memory: 3 connections, 25% full (24 MiB of 96 MiB in use), 0 waits"}},
		{on(rpc.ShmServerStats{Conns: 3, InUse: 1 << 20, Capacity: 96 << 20, Waits: 7}), unix, Warn, []string{"7 waits", "7 payloads waited for space in a full half (back-pressure"}},
		{on(rpc.ShmServerStats{Conns: 1, InUse: 30 << 20, Capacity: 32 << 20}), unix, Warn, []string{"94% full", "nearly full"}},
		{on(rpc.ShmServerStats{Conns: 1, Capacity: 32 << 20, OverHalf: 1}), unix, Warn, []string{"1 payload larger than a half went through the socket"}},
		{on(rpc.ShmServerStats{Conns: 1, InUse: 32 << 20, Capacity: 32 << 20, Waits: 9, Stalled: 3}), unix, Warn, []string{"9 waits", "3 answers went on the socket instead", "memory budget (MaxConnBytes, or MaxServerBytes"}},
		{on(rpc.ShmServerStats{Stalled: 1, Sent: 1}), unix, Warn, []string{"no connection uses it now", "1 payload sent and 0 received", "1 answer went on the socket instead"}},
		{on(rpc.ShmServerStats{Conns: 1, Capacity: 32 << 20, Sent: 80, Received: 80, SlotCalls: 120, AreaSentBytes: 5 << 20, AreaReceivedBytes: 5 << 20}), unix, Pass, []string{"80 payloads sent and 80 received", "120 calls through call slots, with 5 MiB sent and 5 MiB received in their payload areas"}},
		{on(rpc.ShmServerStats{Conns: 1, Capacity: 32 << 20, SlotCalls: 1, SpuriousWakes: 2}), unix, Pass, []string{"1 call through call slots", "2 wake-ups of the call-slot pollers found nothing to do"}},
	} {
		r := &Report{}
		shmCheck(r, c.a, c.st)
		sh := r.Get("shm")
		if sh == nil || sh.Status != c.status {
			t.Errorf("%+v: %+v, want %s", c.st, sh, c.status)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(sh.Detail, w) {
				t.Errorf("%+v: detail %q lacks %q", c.st, sh.Detail, w)
			}
		}
		if (sh.Status == Warn) != (sh.Fix != "") {
			t.Errorf("%+v: status %s with fix %q: a warning says what to do, a pass does not", c.st, sh.Status, sh.Fix)
		}
	}
}

// TestUdskitRefusalRecognised: a udskit server whose peer policy refuses
// this user sends a refusal in place of its hello (spec 5.4): the protocol
// line names it and says what to do, and no statistics are asked for.
func TestUdskitRefusalRecognised(t *testing.T) {
	p := filepath.Join(shortDir(t), "locked-udskit.sock")
	l, err := uds.Listen(context.Background(), "unix:"+p, uds.ListenOptions{
		Policy: func(uds.Cred) error { return fmt.Errorf("%w: nobody today", uds.ErrPeerRefused) },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(rpc.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	r := Run(context.Background(), p, quiet())
	c := r.Get("protocol")
	if r.Protocol != "udskit" || c == nil || c.Status != Warn || !strings.Contains(c.Detail, "refused this connection in place of its hello (error permission_denied)") ||
		!strings.Contains(c.Detail, fmt.Sprintf("uid %d", os.Geteuid())) || !strings.Contains(c.Fix, "--allow-uid") {
		t.Fatalf("protocol %q %+v:\n%s", r.Protocol, c, dump(r))
	}
	if r.Get("shm") != nil {
		t.Fatalf("statistics asked of a server that refused us:\n%s", dump(r))
	}
	// The recognition is a pure function of the bytes: a truncated frame is not one.
	b := rpc.RefusalNotice(uds.Cred{UID: 7}, nil)
	if proto, d := Identify("", b); proto != "udskit" || !strings.Contains(d, "uid 7") {
		t.Fatalf("Identify(refusal) = %q %q", proto, d)
	}
	if proto, _ := Identify("", b[:20]); proto == "udskit" {
		t.Fatal("a truncated refusal recognised")
	}
}

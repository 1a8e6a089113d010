package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// hoardingClient is a shared-memory client that never releases the
// server's slots (a consumer that stops reading): it offers a 1 MiB region
// (the server's half: 512 KiB) and sends n echo requests of size bytes on
// the socket, so the answers fill the server's half and the rest wait.
func hoardingClient(t *testing.T, path string, n, size int) {
	t.Helper()
	uc, _ := hoardingConn(t, path)
	for id := uint32(1); id <= uint32(n); id++ {
		if _, err := uc.Write(echoRequest(id, size)); err != nil {
			t.Fatal(err)
		}
	}
}

// echoRequest is the frame of an echo request of a JSON string of size bytes.
func echoRequest(id uint32, size int) []byte {
	req := []byte(`"` + strings.Repeat("x", size-2) + `"`)
	head := frame.AppendRequestHead(nil, "echo")
	h := frame.Header{Type: frame.TypeRequest, ID: id, HeadLen: uint16(len(head)), PayloadLen: uint32(len(req))}
	return append(append(h.Append(nil), head...), req...)
}

// hoardingConn is hoardingClient's connection, its offer accepted, and
// the client's mapping of the region.
func hoardingConn(t *testing.T, path string) (*net.UnixConn, *shm.Region) {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	uc := nc.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(30 * time.Second))
	var hb [frame.HelloSize]byte
	(&frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | shm.FeatureShm, MaxFrame: frame.DefaultMaxFrame}).Put(hb[:])
	if _, err := uc.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(uc, hb[:]); err != nil {
		t.Fatal(err)
	}
	region, fd, err := shm.Create(shm.MinRegion * 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(region.Close)
	err = uds.SendFDs(uc, shm.AppendOffer(nil, region.Size()), []int{fd})
	shm.CloseFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	ans := make([]byte, shm.AnswerSize)
	if _, err := io.ReadFull(uc, ans); err != nil {
		t.Fatal(err)
	}
	if ok, err := shm.ParseAnswer(ans); !ok || err != nil {
		t.Fatalf("offer refused: %v", err)
	}
	return uc, region
}

// TestShmStatsShown: a real `udskit serve` with a real shared-memory
// client: `udskit ls --stats` shows its region and fill level, `udskit
// doctor` explains it (PASS); once a client hoards the server's half,
// both show the waits and the doctor warns with a fix.
func TestShmStatsShown(t *testing.T) {
	dir := t.TempDir()
	s := scServe(t, filepath.Join(dir, "udskit.sock"))
	path := strings.TrimPrefix(s.addr, "unix:")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, s.addr, rpc.ClientOptions{Conns: 1, LargeConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := []byte(`"` + strings.Repeat("y", 100<<10) + `"`)
	for range 3 {
		if _, err := c.CallRaw(ctx, "echo", big, nil); err != nil {
			t.Fatal(err)
		}
	}

	lsStats := func() *socklist.Udskit {
		t.Helper()
		r := scRun(t, "", "ls", "--stats", "--json", filepath.Join(dir, "*"))
		var out struct{ Sockets []socklist.Socket }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("ls --stats --json: exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		for _, so := range out.Sockets {
			if so.Path == path && so.Listening() {
				return so.Udskit
			}
		}
		t.Fatalf("ls --stats --json lacks %s: %s", path, r.stdout)
		return nil
	}
	u := lsStats()
	if u == nil || u.Stats == nil || u.Stats.Shm.Conns != 1 || u.Stats.Shm.Sent != 3 || u.Stats.Shm.Received != 3 || u.Stats.Shm.Waits != 0 {
		t.Fatalf("ls --stats: %+v", u)
	}
	r := scRun(t, "", "ls", "--stats", filepath.Join(dir, "*"))
	if !strings.Contains(r.stdout, "udskit, shm 1 region ") || !strings.Contains(r.stdout, "of 32 MiB), 0 waits") {
		t.Fatalf("ls --stats table:\n%s%s", r.stdout, r.stderr)
	}
	if r := scRun(t, "", "ls", filepath.Join(dir, "*")); strings.Contains(r.stdout, "shm") {
		t.Fatalf("ls without --stats probed:\n%s", r.stdout)
	}
	r = scRun(t, "", "doctor", path)
	if r.code != 0 || !strings.Contains(r.stdout, "PASS  shm          shared memory: 1 connection, ") || !strings.Contains(r.stdout, "0 waits; 3 payloads sent and 3 received") {
		t.Fatalf("doctor: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	hoardingClient(t, path, 3, 200<<10)
	deadline := time.Now().Add(20 * time.Second)
	for u = lsStats(); u.Stats.Shm.Waits == 0; u = lsStats() {
		if time.Now().After(deadline) {
			t.Fatalf("no wait counted: %+v", u.Stats)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if u.Stats.Shm.Conns != 2 || u.Stats.Shm.Waits != 1 {
		t.Fatalf("ls --stats with a hoarding client: %+v", u.Stats)
	}
	r = scRun(t, "", "doctor", path)
	if r.code != 0 || !strings.Contains(r.stdout, "WARN  shm          shared memory: 2 connections, ") ||
		!strings.Contains(r.stdout, "1 payload waited for space in a full half (back-pressure") || !strings.Contains(r.stdout, "LargeConns") {
		t.Fatalf("doctor with a hoarding client: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := scRun(t, "", "ls", "--stats", filepath.Join(dir, "*")); !strings.Contains(r.stdout, "udskit, shm 2 regions ") || !strings.Contains(r.stdout, "1 wait") {
		t.Fatalf("ls --stats table:\n%s", r.stdout)
	}
}

// TestServeShmMetrics: `udskit serve --metrics` exports the shared-memory
// path: a `udskit call` of 64 KiB counts one payload each way, `--no-shm`
// calls count none, and no region stays once the callers are gone.
func TestServeShmMetrics(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	srv := scServe(t, sock, "--metrics", "tcp:127.0.0.1:0")
	url := metricsURL(t, srv.stderr)
	payload := `"` + strings.Repeat("z", 64<<10) + `"`
	for _, args := range [][]string{{"call", "--raw", sock, "echo"}, {"call", "--raw", "--no-shm", sock, "echo"}, {"call", "--raw", sock, "echo"}} {
		if r := scRun(t, payload, args...); r.code != 0 || r.stdout != payload {
			t.Fatalf("udskit %v: exit %d: %.200s", args, r.code, r.stderr)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	body := curlMetrics(t, url)
	for sample(body, "udskit_rpc_server_shm_connections") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a region stayed after the callers left:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond)
		body = curlMetrics(t, url)
	}
	for series, want := range map[string]float64{
		`udskit_rpc_server_shm_payloads_total{direction="received"}`: 2,
		`udskit_rpc_server_shm_payloads_total{direction="sent"}`:     2,
		`udskit_rpc_server_shm_waits_total`:                          0,
		`udskit_rpc_server_shm_bytes_in_use`:                         0,
		`udskit_rpc_server_shm_bytes_capacity`:                       0,
	} {
		if got := sample(body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestShmStalledShown: a client that never releases the server's slots
// and keeps sending 400 KiB echoes against a real `udskit serve` (its
// default budget, 16 MiB per connection): the answers wait for space in
// the full half, their calls hold the budget, the reader stops on it, and
// the waiting answers go on the socket. `udskit ls --stats` (JSON and the
// table) and `udskit doctor` show them as stalled, the doctor with the fix.
func TestShmStalledShown(t *testing.T) {
	dir := t.TempDir()
	s := scServe(t, filepath.Join(dir, "udskit.sock"))
	path := strings.TrimPrefix(s.addr, "unix:")
	uc, _ := hoardingConn(t, path)
	go func() { // it ends blocked on the held reader, or with uc closed at the test's end
		for id := uint32(1); id <= 60; id++ {
			if _, err := uc.Write(echoRequest(id, 400<<10)); err != nil {
				return
			}
		}
	}()
	var st *socklist.UdskitStats
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := scRun(t, "", "ls", "--stats", "--json", filepath.Join(dir, "*"))
		var out struct{ Sockets []socklist.Socket }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("ls --stats --json: exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		for _, so := range out.Sockets {
			if so.Path == path && so.Listening() && so.Udskit != nil && so.Udskit.Stats != nil {
				st = so.Udskit.Stats
			}
		}
		if st != nil && st.Shm.Stalled > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stalled answer counted: %s", r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Shm.Conns != 1 || st.Shm.Sent != 1 || st.Shm.Waits < st.Shm.Stalled {
		t.Fatalf("ls --stats: %+v, want 1 region, 1 answer in it, every stalled answer counted as a wait first", st.Shm)
	}
	r := scRun(t, "", "ls", "--stats", filepath.Join(dir, "*"))
	if !strings.Contains(r.stdout, "udskit, shm 1 region ") || !strings.Contains(r.stdout, " stalled") {
		t.Fatalf("ls --stats table:\n%s%s", r.stdout, r.stderr)
	}
	r = scRun(t, "", "doctor", path)
	if r.code != 0 || !strings.Contains(r.stdout, "WARN  shm          shared memory: 1 connection, ") ||
		!strings.Contains(r.stdout, "went on the socket instead: the server's half was full while the connection's reader waited for its memory budget") ||
		!strings.Contains(r.stdout, "MaxConnBytes (default 16 MiB)") {
		t.Fatalf("doctor with stalled answers: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

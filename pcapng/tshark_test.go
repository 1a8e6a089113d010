package pcapng

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needTshark returns tshark's path; a missing tshark fails the test (it is
// installed by scripts/install-deps.sh), so a skip never passes silently.
func needTshark(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (run scripts/install-deps.sh): %v", err)
	}
	return p
}

// tshark runs tshark with args and returns its stdout.
func tshark(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTshark(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("tshark %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// followRaw returns the bytes each side sent in TCP stream n, per
// tshark -z follow,tcp,raw,n (server lines are indented with a tab).
func followRaw(t *testing.T, file string, n int) (client, server []byte) {
	t.Helper()
	out := tshark(t, "-r", file, "-q", "-z", "follow,tcp,raw,"+strconv.Itoa(n))
	inData := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "Node 1:") {
			inData = true
			continue
		}
		if !inData || strings.HasPrefix(line, "====") || strings.TrimSpace(line) == "" {
			continue
		}
		isServer := strings.HasPrefix(line, "\t")
		b, err := hex.DecodeString(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("follow output line %q: %v", line, err)
		}
		if isServer {
			server = append(server, b...)
		} else {
			client = append(client, b...)
		}
	}
	return client, server
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestTsharkSeesFlows(t *testing.T) {
	needTshark(t)
	file := filepath.Join(t.TempDir(), "x.pcapng")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(f, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ifc, err := w.AddInterface("/tmp/app.sock", "test socket")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 123456789)
	fl, err := w.OpenFlow(FlowInfo{Interface: ifc, ServerPort: 80, Comment: "client pid 42 uid 1000 gid 1000 comm curl"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	req := []byte("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	body := pattern(200_000, 3) // several segments
	resp := append([]byte("HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n"), body...)
	must(t, fl.Data(ClientToServer, t0.Add(time.Millisecond), req))
	must(t, fl.Shutdown(ClientToServer, t0.Add(2*time.Millisecond)))
	must(t, fl.DataNote(ServerToClient, t0.Add(3*time.Millisecond), resp, "the answer"))
	must(t, fl.Close(false, t0.Add(4*time.Millisecond)))

	fl2, err := w.OpenFlow(FlowInfo{Interface: ifc, ServerPort: 9}, t0.Add(5*time.Millisecond))
	must(t, err)
	must(t, fl2.Data(ServerToClient, t0.Add(6*time.Millisecond), []byte("greeting")))
	must(t, fl2.Data(ClientToServer, t0.Add(7*time.Millisecond), []byte("bye")))
	must(t, fl2.Close(true, t0.Add(8*time.Millisecond)))
	must(t, w.Close())
	must(t, f.Close())

	c, s := followRaw(t, file, 0)
	if !bytes.Equal(c, req) || !bytes.Equal(s, resp) {
		t.Fatalf("stream 0: client %d bytes (want %d), server %d bytes (want %d)", len(c), len(req), len(s), len(resp))
	}
	c, s = followRaw(t, file, 1)
	if string(c) != "bye" || string(s) != "greeting" {
		t.Fatalf("stream 1: client %q server %q", c, s)
	}
	// HTTP dissected on port 80; no TCP analysis complaints (bad seq/ack,
	// retransmissions, window full, ...) except the one reset we asked for.
	if got := tshark(t, "-r", file, "-Y", "http.request", "-T", "fields", "-e", "http.request.uri"); strings.TrimSpace(got) != "/hello" {
		t.Fatalf("http.request.uri = %q", got)
	}
	if got := tshark(t, "-r", file, "-Y", "tcp.analysis.flags && !tcp.analysis.window_update", "-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message"); got != "" {
		t.Fatalf("tshark flags TCP problems:\n%s", got)
	}
	if got := tshark(t, "-r", file, "-Y", "tcp.flags.reset==1", "-T", "fields", "-e", "tcp.stream"); strings.TrimSpace(got) != "1" {
		t.Fatalf("reset packets in streams %q, want only stream 1", got)
	}
	comments := tshark(t, "-r", file, "-Y", "frame.comment", "-T", "fields", "-e", "frame.comment")
	if !strings.Contains(comments, "comm curl") || !strings.Contains(comments, "the answer") {
		t.Fatalf("comments: %q", comments)
	}
	// Interface name and nanosecond timestamps.
	got := tshark(t, "-r", file, "-c", "1", "-T", "fields", "-e", "frame.interface_name", "-e", "frame.time_epoch")
	if !strings.Contains(got, "/tmp/app.sock") || !strings.Contains(got, "1700000000.123456789") {
		t.Fatalf("first frame: %q", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

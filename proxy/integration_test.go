package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsvc"
)

func tcpPort(t *testing.T, p *Proxy, i int) int {
	t.Helper()
	_, port, err := net.SplitHostPort(p.Addrs()[i].Name)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

func psql(t *testing.T, host string, port int, stdin []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := testsvc.Psql(ctx, host, port, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("psql -h %s -p %d %v: %v\n%s", host, port, args, err, stderr.String())
	}
	return out
}

// TestPostgresUnixOnlyOverTCP: PostgreSQL listens only on a unix socket; the
// proxy exposes it on 127.0.0.1, and psql over TCP runs queries and moves a
// COPY of several MB both ways intact.
func TestPostgresUnixOnlyOverTCP(t *testing.T) {
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{})
	p, lb := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: pg.SocketPath()}}, Options{})
	port := tcpPort(t, p, 0)

	if got := strings.TrimSpace(string(psql(t, "127.0.0.1", port, nil, "-c", "select inet_client_addr() is null, current_setting('listen_addresses')"))); got != "t|" {
		t.Fatalf("server view through the proxy = %q, want a unix-socket client and listen_addresses empty", got)
	}
	// Several MB out of the server...
	data := psql(t, "127.0.0.1", port, nil, "-c",
		"COPY (SELECT i, md5(i::text), repeat(chr(65 + i % 26), 120) FROM generate_series(1, 40000) i) TO STDOUT")
	if len(data) < 5<<20 {
		t.Fatalf("COPY TO STDOUT gave only %d bytes", len(data))
	}
	// ...back into a table through the proxy, and out again, byte for byte.
	psql(t, "127.0.0.1", port, nil, "-c", "CREATE TABLE rt (i int, h text, pad text)")
	psql(t, "127.0.0.1", port, data, "-c", "COPY rt FROM STDIN")
	again := psql(t, "127.0.0.1", port, nil, "-c", "COPY (SELECT * FROM rt ORDER BY i) TO STDOUT")
	if !bytes.Equal(again, data) {
		t.Fatalf("COPY round trip differs: %d bytes out, %d bytes back", len(data), len(again))
	}
	// And the server itself (over its own socket) agrees on the content.
	direct := pg.Query(t, "SELECT count(*), md5(string_agg(h, '' ORDER BY i)) FROM rt")
	if !strings.HasPrefix(direct, "40000|") {
		t.Fatalf("direct check: %q", direct)
	}
	if !strings.Contains(lb.String(), "bytes_in=") {
		t.Fatalf("no per-connection log line:\n%s", lb.String())
	}
}

// TestPostgresTCPOnlyAsUnixSocket is the seed 000 situation: the server only
// speaks TCP, the client insists on DIR/.s.PGSQL.PORT. The proxy makes that
// socket and psql -h DIR works.
func TestPostgresTCPOnlyAsUnixSocket(t *testing.T) {
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{TCP: true})
	dir := sockDir(t)
	sock := filepath.Join(dir, ".s.PGSQL.5432")
	startProxy(t, []Route{{Listen: sock, To: fmt.Sprintf("tcp:127.0.0.1:%d", pg.Port)}}, Options{})
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("proxy socket %s: %v %v (want mode 0600)", sock, fi, err)
	}
	got := strings.TrimSpace(string(psql(t, dir, 5432, nil, "-c", "select host(inet_client_addr()), 6 * 7")))
	if got != "127.0.0.1|42" {
		t.Fatalf("psql -h %s: %q, want the server to see a TCP client from 127.0.0.1", dir, got)
	}
}

// TestRedisOverProxiedTCP: redis-server on a unix socket only; redis-benchmark
// and redis-cli talk to it through the proxy's TCP port.
func TestRedisOverProxiedTCP(t *testing.T) {
	testsvc.NeedBinary(t, "redis-cli")
	testsvc.NeedBinary(t, "redis-benchmark")
	rd := testsvc.StartRedis(t, testsvc.RedisOptions{})
	p, _ := startProxy(t, []Route{{Listen: "tcp:127.0.0.1:0", To: rd.Socket}}, Options{})
	port := strconv.Itoa(tcpPort(t, p, 0))
	run := func(stdin []byte, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, append([]string{"-h", "127.0.0.1", "-p", port}, args...)...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	bench := run(nil, "redis-benchmark", "-n", "2000", "-c", "8", "-q", "-t", "ping,set,get,lpush")
	for _, op := range []string{"PING", "SET", "GET", "LPUSH"} {
		if !strings.Contains(bench, op) || strings.Contains(strings.ToLower(bench), "error") {
			t.Fatalf("redis-benchmark output lacks %s or has errors:\n%s", op, bench)
		}
	}
	if got := run(nil, "redis-cli", "set", "greeting", "hello through udskit"); got != "OK" {
		t.Fatalf("SET: %q", got)
	}
	if got := run(nil, "redis-cli", "get", "greeting"); got != "hello through udskit" {
		t.Fatalf("GET: %q", got)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB value
	if got := run(big, "redis-cli", "-x", "set", "big"); got != "OK" {
		t.Fatalf("SET big: %q", got)
	}
	if got := run(nil, "redis-cli", "strlen", "big"); got != strconv.Itoa(len(big)+1) && got != strconv.Itoa(len(big)) {
		t.Fatalf("STRLEN big = %s, want %d", got, len(big))
	}
}

// TestCurlThroughUnixToTCP: a Go HTTP server on TCP, the proxy gives it a unix
// socket, curl --unix-socket uploads and downloads through it.
func TestCurlThroughUnixToTCP(t *testing.T) {
	curl := testsvc.NeedBinary(t, "curl")
	body := randomBytes(4 << 20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/download":
			w.Write(body)
		case "/upload":
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
		default:
			http.NotFound(w, r)
		}
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	sock := filepath.Join(sockDir(t), "http.sock")
	startProxy(t, []Route{{Listen: sock, To: "tcp:" + l.Addr().String()}}, Options{})

	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, curl, append([]string{"-sS", "--fail", "--unix-socket", sock}, args...)...).Output()
		if err != nil {
			t.Fatalf("curl %v: %v", args, err)
		}
		return out
	}
	if got := run("http://localhost/download"); !bytes.Equal(got, body) {
		t.Fatalf("download: %d bytes, want %d intact", len(got), len(body))
	}
	up := filepath.Join(t.TempDir(), "up.bin")
	os.WriteFile(up, body, 0o600)
	sum := sha256.Sum256(body)
	want := fmt.Sprintf("%d %s", len(body), hex.EncodeToString(sum[:]))
	if got := string(run("--data-binary", "@"+up, "http://localhost/upload")); got != want {
		t.Fatalf("upload: %q, want %q", got, want)
	}
}

package httpcred_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/httpcred"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// whoHandler answers with the caller's credentials and counts its calls.
type whoHandler struct{ calls atomic.Int64 }

func (h *whoHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	cred, ok := httpcred.FromRequest(r)
	json.NewEncoder(w).Encode(map[string]any{"ok": ok, "pid": cred.PID, "uid": cred.UID, "gid": cred.GID})
}

// serveHTTP serves g around a whoHandler on l and returns the handler.
func serveHTTP(t *testing.T, g *httpcred.Guard, l net.Listener) *whoHandler {
	t.Helper()
	h := &whoHandler{}
	srv := &http.Server{Handler: g.Handler(h), ConnContext: g.ConnContext, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// listenShared listens with uds.Listen on a socket any user may connect to.
func listenShared(t *testing.T) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t, 0o755), "http.sock")
	l, err := uds.Listen(context.Background(), "unix:"+path, uds.ListenOptions{Mode: 0o666})
	if err != nil {
		t.Fatal(err)
	}
	return l, path
}

type curlResult struct {
	pid    int
	status int
	body   string
}

// curl runs curl --unix-socket path (through prefix, e.g. setpriv) and
// returns its pid, the HTTP status and the body.
func curl(t *testing.T, path string, prefix ...string) curlResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(append([]string{}, prefix...), "curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}", "--unix-socket", path, "http://localhost/who")
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = "/"
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	s := out.String()
	i := strings.LastIndexByte(s, '\n')
	var code int
	fmt.Sscan(s[i+1:], &code)
	return curlResult{pid: cmd.Process.Pid, status: code, body: s[:i]}
}

func asNobody(t *testing.T) []string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run curl as nobody (tests run as root in CI)")
	}
	uid := fmt.Sprint(testutil.NobodyUID)
	return []string{"setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups"}
}

// curl as root is let through and its handler sees curl's own pid and uid 0;
// curl as nobody gets 403 and no handler runs.
func TestCurlRootAllowedNobodyRefused(t *testing.T) {
	var logged testutil.Buffer
	g := httpcred.New(httpcred.Options{Policy: uds.AllowRoot(), Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	l, path := listenShared(t)
	h := serveHTTP(t, g, l)

	r := curl(t, path)
	var seen struct {
		OK  bool   `json:"ok"`
		PID int    `json:"pid"`
		UID uint32 `json:"uid"`
	}
	if err := json.Unmarshal([]byte(r.body), &seen); err != nil || r.status != 200 {
		t.Fatalf("curl as root: %d %q (%v)", r.status, r.body, err)
	}
	if !seen.OK || seen.PID != r.pid || seen.UID != 0 {
		t.Fatalf("handler saw %+v; curl was pid %d, uid 0", seen, r.pid)
	}

	prefix := asNobody(t)
	r = curl(t, path, prefix...)
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "refused by the server's policy") {
		t.Fatalf("curl as nobody: %d %q; want 403", r.status, r.body)
	}
	if h.calls.Load() != 1 || g.Refused() != 1 {
		t.Fatalf("handler calls %d (want 1: root's), refused %d (want 1)", h.calls.Load(), g.Refused())
	}
	if s := logged.String(); !strings.Contains(s, fmt.Sprintf("uid=%d", testutil.NobodyUID)) || !strings.Contains(s, "not in [0]") {
		t.Fatalf("refusal log %q lacks the uid and reason", s)
	}
}

// With the same policy on uds.Listen too, nobody is closed at accept
// (curl fails to get any reply), and root still gets through.
func TestWithListenPolicy(t *testing.T) {
	path := filepath.Join(testutil.ShortDir(t, 0o755), "http.sock")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := uds.Listen(context.Background(), "unix:"+path, uds.ListenOptions{Mode: 0o666, Policy: uds.AllowRoot(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	g := httpcred.New(httpcred.Options{Policy: uds.AllowRoot(), Logger: quiet})
	h := serveHTTP(t, g, l)
	if r := curl(t, path); r.status != 200 {
		t.Fatalf("root: %+v", r)
	}
	prefix := asNobody(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append(prefix, "curl", "-sS", "--max-time", "10", "--unix-socket", path, "http://localhost/who")
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err == nil || h.calls.Load() != 1 || g.Refused() != 0 {
		t.Fatalf("nobody through uds.Listen's policy: %v %q; handler calls %d, guard refusals %d", err, out, h.calls.Load(), g.Refused())
	}
}

// TCP peers carry no credentials: refused by default, let through (with ok
// false) with AllowNoCred.
func TestTCP(t *testing.T) {
	for _, allow := range []bool{false, true} {
		g := httpcred.New(httpcred.Options{AllowNoCred: allow, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serveHTTP(t, g, l)
		resp, err := http.Get("http://" + l.Addr().String() + "/who")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := http.StatusForbidden
		if allow {
			want = http.StatusOK
		}
		if resp.StatusCode != want || allow && !strings.Contains(string(body), `"ok":false`) {
			t.Fatalf("AllowNoCred %v: %d %s", allow, resp.StatusCode, body)
		}
	}
}

// A Guard's Handler without its ConnContext refuses rather than serving
// without a policy.
func TestHandlerWithoutConnContext(t *testing.T) {
	g := httpcred.New(httpcred.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &whoHandler{}
	srv := &http.Server{Handler: g.Handler(h)}
	go srv.Serve(l)
	defer srv.Close()
	resp, err := http.Get("http://" + l.Addr().String() + "/who")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "ConnContext") || h.calls.Load() != 0 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

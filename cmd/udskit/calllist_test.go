package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// TestCallList: `udskit call ADDR --list` prints the demo server's methods
// (udskit.methods), sorted, with kind and format, and no standard method.
func TestCallList(t *testing.T) {
	s := scServe(t, filepath.Join(t.TempDir(), "list.sock"))
	r := scRun(t, "", "call", s.addr, "--list")
	if r.code != 0 {
		t.Fatalf("--list: %+v", r)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("line %q: want name kind format", line)
		}
		names = append(names, f[0])
		if f[0] == "stream" && f[1] != "stream" || f[0] == "echo" && f[1] != "unary" ||
			f[0] == "sum" && f[1] != "bidi" || f[0] == "total" && f[1] != "client_stream" {
			t.Errorf("kind: %q", line)
		}
	}
	if strings.Join(names, ",") != "echo,fail,sleep,stream,sum,total,whoami" {
		t.Fatalf("methods %v:\n%s", names, r.stdout)
	}
	if r := scRun(t, "", "call", s.addr, "echo", "--list"); r.code != 2 {
		t.Fatalf("--list with a method: want exit 2, got %+v", r)
	}
}

// TestCallHeaders: -H key=value reaches the handler as request metadata.
func TestCallHeaders(t *testing.T) {
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "md.sock")
	l, err := uds.Listen(context.Background(), sock, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := rpc.NewServer(rpc.ServerOptions{})
	rpc.HandleJSON(srv, "md", func(ctx context.Context, _ struct{}) (rpc.Metadata, error) {
		return rpc.MetadataFromContext(ctx), nil
	})
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	r := scRun(t, "", "call", sock, "md", "{}", "-H", "tenant=acme", "-H", "trace=a=b")
	var got map[string]string
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got["tenant"] != "acme" || got["trace"] != "a=b" {
		t.Fatalf("-H: %+v (%v)", r, got)
	}
	if r := scRun(t, "", "call", sock, "md", "{}", "-H", "novalue"); r.code != 2 || !strings.Contains(r.stderr, "key=value") {
		t.Fatalf("-H novalue: %+v", r)
	}
}

// TestServeLogFormatJSON: serve --log-format json writes one JSON object per
// log line (as proxy does); a bad value is usage.
func TestServeLogFormatJSON(t *testing.T) {
	s := scServe(t, filepath.Join(t.TempDir(), "log.sock"), "--log-format", "json")
	if r := scRun(t, "", "call", s.addr, "echo", `1`); r.code != 0 {
		t.Fatalf("call: %+v", r)
	}
	waitLog(t, "serve", s.stderr, `"msg":`)
	for _, line := range strings.Split(strings.TrimSpace(s.stderr.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] == nil || m["level"] == nil {
			t.Fatalf("not a JSON log line: %q (%v)", line, err)
		}
	}
	if r := scRun(t, "", "serve", filepath.Join(t.TempDir(), "x.sock"), "--log-format", "xml"); r.code != 2 || !strings.Contains(r.stderr, "want text or json") {
		t.Fatalf("--log-format xml: %+v", r)
	}
}

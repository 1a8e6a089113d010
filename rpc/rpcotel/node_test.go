package rpcotel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcotel"
	"github.com/udskit/udskit/uds"
)

// docNodeApp returns the ```js block of docs/observability.md: the Node app.
func docNodeApp(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```js\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	if len(m) != 1 {
		t.Fatalf("docs/observability.md has %d ```js blocks, want 1 (the Node app)", len(m))
	}
	return m[0][1]
}

func serveTraced(t *testing.T, tr *rpcotel.Tracing, name string, register func(*rpc.Server)) string {
	t.Helper()
	addr := "unix:" + filepath.Join(testutil.ShortDir(t, 0o700), name+".sock")
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(tr.ServerOptions(rpc.ServerOptions{}))
	register(s)
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return addr
}

// The docs' Node app calls a Go sidecar, whose handler calls back into the
// app's Node service: one trace from the Node app's request through the
// sidecar's server and client spans to the Node handler's ctx.trace, each hop
// the child of the one before, printed as the in-memory exporter recorded them.
func TestNodeAppThroughGoSidecar(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := rpcotel.New(rpcotel.Options{TracerProvider: tp})

	type nodeTrace struct {
		TraceID string `json:"traceId"`
		SpanID  string `json:"spanId"`
		Flags   int    `json:"flags"`
	}
	type profile struct {
		User  int        `json:"user"`
		Name  string     `json:"name"`
		Trace *nodeTrace `json:"trace"`
	}
	profiles := "unix:" + filepath.Join(testutil.ShortDir(t, 0o700), "profiles.sock") // the Node app's service
	sidecar := serveTraced(t, tr, "sidecar", func(s *rpc.Server) {
		rpc.HandleJSON(s, "lookup", func(ctx context.Context, req struct {
			User int `json:"user"`
		}) (profile, error) {
			// The Node app serves profiles.sock before it calls lookup.
			bc, err := rpc.Dial(ctx, profiles, tr.ClientOptionsAt(profiles, rpc.ClientOptions{}))
			if err != nil {
				return profile{}, err
			}
			defer bc.Close()
			var p profile
			err = bc.Call(ctx, "profile", req, &p) // ctx: the server span is the parent
			return p, err
		})
	})

	dir := testutil.NodeModules(t)
	app := filepath.Join(dir, "app.mjs")
	if err := os.WriteFile(app, []byte(docNodeApp(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", app, strings.TrimPrefix(sidecar, "unix:"), strings.TrimPrefix(profiles, "unix:"))
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node app: %v\n%s%s", err, out, stderr)
	}
	var res struct {
		Trace, Sent string
		Profile     profile
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Profile.Name != "ada" || res.Profile.User != 42 || res.Profile.Trace == nil {
		t.Fatalf("node app printed %q (%v)", out, err)
	}
	sent := regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`).FindStringSubmatch(res.Sent)
	if sent == nil || sent[1] != res.Trace {
		t.Fatalf("the Node app sent traceparent %q, want a child of its trace %s", res.Sent, res.Trace)
	}

	spans := waitSpans(t, exp, 2)
	lookup := find(t, spans, "lookup", trace.SpanKindServer)
	cliProfile := find(t, spans, "profile", trace.SpanKindClient)
	for _, s := range []tracetest.SpanStub{lookup, cliProfile} {
		if s.SpanContext.TraceID().String() != res.Trace {
			t.Fatalf("span %s %v in trace %s, not the Node app's %s", s.Name, s.SpanKind, s.SpanContext.TraceID(), res.Trace)
		}
	}
	if lookup.Parent.SpanID().String() != sent[2] || !lookup.Parent.IsRemote() {
		t.Fatalf("the sidecar's span has parent %s, want the Node app's call %s", lookup.Parent.SpanID(), sent[2])
	}
	if cliProfile.Parent.SpanID() != lookup.SpanContext.SpanID() {
		t.Fatal("want the sidecar's server span -> its client span to the Node service")
	}
	back := res.Profile.Trace
	if back.TraceID != res.Trace || back.SpanID != cliProfile.SpanContext.SpanID().String() || back.Flags != 1 {
		t.Fatalf("the Node service's ctx.trace is %+v, want trace %s with parent %s (the sidecar's client span), sampled",
			*back, res.Trace, cliProfile.SpanContext.SpanID())
	}
	la := attrs(lookup)
	if la[rpcotel.AttrPeerPID].AsInt64() != int64(cmd.Process.Pid) || la[rpcotel.AttrCode].AsString() != "ok" {
		t.Fatalf("the sidecar span's peer pid %v, want the node process %d; code %v", la[rpcotel.AttrPeerPID], cmd.Process.Pid, la[rpcotel.AttrCode])
	}
	// The hops, as docs/observability.md shows them.
	t.Logf("trace %s (from the Node app)", res.Trace)
	t.Logf("  node app sent traceparent %s", res.Sent)
	for i, s := range []tracetest.SpanStub{lookup, cliProfile} {
		a := attrs(s)
		line := fmt.Sprintf("%s%s %s  span %s parent %s remote=%v  code %s", strings.Repeat("  ", i+1), kindName(s.SpanKind), s.Name,
			s.SpanContext.SpanID(), s.Parent.SpanID(), s.Parent.IsRemote(), a[rpcotel.AttrCode].AsString())
		if v, ok := a[rpcotel.AttrPeerPID]; ok {
			line += fmt.Sprintf("  peer pid %d uid %d", v.AsInt64(), a[rpcotel.AttrPeerUID].AsInt64())
		}
		if v, ok := a[rpcotel.AttrServer]; ok {
			line += "  server.address " + v.AsString()
		}
		t.Log(line)
	}
	t.Logf("      node profile  ctx.trace %s parent %s", back.TraceID, back.SpanID)
}

func kindName(k trace.SpanKind) string {
	switch k {
	case trace.SpanKindServer:
		return "server"
	case trace.SpanKindClient:
		return "client"
	}
	return k.String()
}

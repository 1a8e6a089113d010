package rpcotel_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcotel"
	"github.com/udskit/udskit/uds"
)

// setup serves a traced server and dials a traced client, both recording
// into one in-memory exporter (as if the two were separate processes
// exporting to one collector).
func setup(t *testing.T) (*tracetest.InMemoryExporter, *rpc.Client, *rpc.Server, string, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tr := rpcotel.New(rpcotel.Options{TracerProvider: tp})
	s := rpc.NewServer(tr.ServerOptions(rpc.ServerOptions{}))
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		// A span the handler makes is a child of the server span.
		_, span := tp.Tracer("app").Start(ctx, "handler work")
		span.End()
		return append(dst, req...), nil
	})
	s.HandleRaw("fail", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return nil, rpc.Errorf(rpc.NotFound, "no such thing")
	})
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
		send([]byte("a"))
		return send([]byte("b"))
	})
	addr := "unix:" + filepath.Join(t.TempDir(), "otel.sock")
	l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	c, err := rpc.Dial(context.Background(), addr, tr.ClientOptionsAt(addr, rpc.ClientOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return exp, c, s, addr, tp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// find returns the one span named name of kind.
func find(t *testing.T, spans tracetest.SpanStubs, name string, kind trace.SpanKind) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name && s.SpanKind == kind {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %v spans named %q in %d spans", len(found), kind, name, len(spans))
	}
	return found[0]
}

// waitSpans waits for n spans: the server span ends after the response is
// on its way, so the client may see its answer first.
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, n int) tracetest.SpanStubs {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		spans := exp.GetSpans()
		if len(spans) >= n {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spans after 5s, want %d: %v", len(spans), n, spans)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A call under an application span: client span child of it, server span
// child of the client span (one trace across the socket), the handler's
// span child of the server span; method, code and peer on the spans.
func TestClientAndServerSpansOneTrace(t *testing.T) {
	exp, c, _, addr, tp := setup(t)
	ctx, root := tp.Tracer("app").Start(context.Background(), "app request")
	if _, err := c.CallRaw(ctx, "echo", []byte("hi"), nil); err != nil {
		t.Fatal(err)
	}
	root.End()
	spans := waitSpans(t, exp, 4)
	app := find(t, spans, "app request", trace.SpanKindInternal)
	cli := find(t, spans, "echo", trace.SpanKindClient)
	srv := find(t, spans, "echo", trace.SpanKindServer)
	work := find(t, spans, "handler work", trace.SpanKindInternal)
	tid := app.SpanContext.TraceID()
	for _, s := range []tracetest.SpanStub{cli, srv, work} {
		if s.SpanContext.TraceID() != tid {
			t.Fatalf("span %s %v is in trace %s, not the app's %s", s.Name, s.SpanKind, s.SpanContext.TraceID(), tid)
		}
	}
	if cli.Parent.SpanID() != app.SpanContext.SpanID() || srv.Parent.SpanID() != cli.SpanContext.SpanID() ||
		work.Parent.SpanID() != srv.SpanContext.SpanID() || !srv.Parent.IsRemote() {
		t.Fatal("parent links: want app -> client -> (remote) server -> handler work")
	}
	sa, ca := attrs(srv), attrs(cli)
	if sa[rpcotel.AttrSystem].AsString() != "udskit" || sa[rpcotel.AttrMethod].AsString() != "echo" || sa[rpcotel.AttrCode].AsString() != "ok" {
		t.Fatalf("server span attributes %v", sa)
	}
	if sa[rpcotel.AttrPeerPID].AsInt64() != int64(os.Getpid()) || sa[rpcotel.AttrPeerUID].AsInt64() != int64(os.Getuid()) {
		t.Fatalf("server span peer %v %v; want this process %d uid %d", sa[rpcotel.AttrPeerPID], sa[rpcotel.AttrPeerUID], os.Getpid(), os.Getuid())
	}
	if ca[rpcotel.AttrMethod].AsString() != "echo" || ca[rpcotel.AttrCode].AsString() != "ok" || ca[rpcotel.AttrServer].AsString() != addr {
		t.Fatalf("client span attributes %v", ca)
	}
	if srv.Status.Code == codes.Error || cli.Status.Code == codes.Error {
		t.Fatal("a successful call's span has status Error")
	}
}

// A failing call: both spans carry the code and status Error.
func TestFailedCallSpans(t *testing.T) {
	exp, c, _, _, _ := setup(t)
	if _, err := c.CallRaw(context.Background(), "fail", nil, nil); rpc.CodeOf(err) != rpc.NotFound {
		t.Fatal(err)
	}
	spans := waitSpans(t, exp, 2)
	for _, kind := range []trace.SpanKind{trace.SpanKindClient, trace.SpanKindServer} {
		s := find(t, spans, "fail", kind)
		if attrs(s)[rpcotel.AttrCode].AsString() != "not_found" || s.Status.Code != codes.Error {
			t.Fatalf("%v span of a failed call: %v %v", kind, attrs(s), s.Status)
		}
	}
	// No parent given: the client span starts a trace the server joins.
	cli, srv := find(t, spans, "fail", trace.SpanKindClient), find(t, spans, "fail", trace.SpanKindServer)
	if cli.Parent.IsValid() || srv.SpanContext.TraceID() != cli.SpanContext.TraceID() {
		t.Fatal("a call without a parent span: want a new trace shared by client and server")
	}
}

// A stream: the client span ends when the stream does.
func TestStreamSpans(t *testing.T) {
	exp, c, _, _, _ := setup(t)
	st, err := c.Stream(context.Background(), "items", []byte{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.RecvRaw(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	spans := waitSpans(t, exp, 2)
	cli, srv := find(t, spans, "items", trace.SpanKindClient), find(t, spans, "items", trace.SpanKindServer)
	if !attrs(cli)[rpcotel.AttrStream].AsBool() || attrs(srv)[rpcotel.AttrCode].AsString() != "ok" || srv.Parent.SpanID() != cli.SpanContext.SpanID() {
		t.Fatalf("stream spans: client %v, server %v", attrs(cli), attrs(srv))
	}
}

// A caller that is not Go (a Node or Python app) sends traceparent and
// tracestate as plain metadata: the server span continues that trace.
func TestForeignTraceparent(t *testing.T) {
	exp, _, _, addr, _ := setup(t)
	plain, err := rpc.Dial(context.Background(), addr, rpc.ClientOptions{}) // no interceptors: like a Node client
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := rpc.WithMetadata(context.Background(), rpc.Metadata{
		"traceparent": "00-" + traceID + "-" + parentID + "-01", "tracestate": "vendor=x"})
	if _, err := plain.CallRaw(ctx, "echo", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	spans := waitSpans(t, exp, 2) // the server span and the handler's
	srv := find(t, spans, "echo", trace.SpanKindServer)
	if srv.SpanContext.TraceID().String() != traceID || srv.Parent.SpanID().String() != parentID || srv.SpanContext.TraceState().Get("vendor") != "x" {
		t.Fatalf("server span %s parent %s state %q; want trace %s parent %s vendor=x",
			srv.SpanContext.TraceID(), srv.Parent.SpanID(), srv.SpanContext.TraceState().String(), traceID, parentID)
	}
}

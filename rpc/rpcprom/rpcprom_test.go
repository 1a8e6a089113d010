package rpcprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcprom"
	"github.com/udskit/udskit/uds"
)

// scrape fetches url with curl, a real HTTP client, and returns the body.
func scrape(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "-sSf", "--max-time", "20", url).Output()
	if err != nil {
		t.Fatalf("curl %s: %v", url, err)
	}
	return string(out)
}

// value returns the sample of name with exactly the labels given (in the
// exposition's order), failing the test when it is missing.
func value(t *testing.T, body, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no sample %s in the exposition:\n%s", series, body)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestScrapedByCurl(t *testing.T) {
	m := rpcprom.New(rpcprom.Options{})
	dir := t.TempDir()
	l, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "app.sock"), uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A second listener whose policy refuses everyone: its refusals count.
	locked, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "locked.sock"), uds.ListenOptions{
		Policy: func(uds.Cred) error { return fmt.Errorf("%w: nobody today", uds.ErrPeerRefused) }, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s := rpc.NewServer(m.ServerOptions(rpc.ServerOptions{}))
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	s.HandleRaw("fail", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return nil, rpc.Errorf(rpc.NotFound, "no such thing")
	})
	s.HandleRawStream("items", func(ctx context.Context, req []byte, send func([]byte) error) error {
		for range 3 {
			if err := send([]byte("abcd")); err != nil {
				return err
			}
		}
		return nil
	})
	m.WatchServer(s)
	m.WatchListener(l)
	m.WatchListener(locked)
	go s.Serve(l)
	go s.Serve(locked)
	defer s.Close()

	url := serveMetrics(t, m)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, l.Addr().String(), m.ClientOptions(rpc.ClientOptions{Conns: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if _, err := c.CallRaw(ctx, "echo", []byte("0123456789"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CallRaw(ctx, "fail", nil, nil); rpc.CodeOf(err) != rpc.NotFound {
		t.Fatal(err)
	}
	st, err := c.Stream(ctx, "items", []byte{})
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
	if _, err := rpc.Dial(ctx, locked.Addr().String(), rpc.ClientOptions{NoReconnect: true}); err == nil {
		t.Fatal("the locked listener let a client in")
	}

	body := scrape(t, url)
	for series, want := range map[string]float64{
		`udskit_rpc_server_calls_total{code="ok",method="echo"}`:          3,
		`udskit_rpc_server_calls_total{code="not_found",method="fail"}`:   1,
		`udskit_rpc_server_calls_total{code="ok",method="items"}`:         1,
		`udskit_rpc_server_call_duration_seconds_count{method="echo"}`:    3,
		`udskit_rpc_server_stream_items_total{method="items"}`:            3,
		`udskit_rpc_server_received_bytes_total`:                          30,
		`udskit_rpc_server_sent_bytes_total`:                              30 + 12,
		`udskit_rpc_server_calls_in_flight`:                               0,
		`udskit_rpc_server_connections`:                                   1,
		`udskit_rpc_server_refused_connections_total{reason="policy"}`:    1,
		`udskit_rpc_server_refused_connections_total{reason="max_conns"}`: 0,
		`udskit_rpc_server_draining`:                                      0,
		`udskit_rpc_client_calls_total{code="ok",method="echo"}`:          3,
		`udskit_rpc_client_calls_total{code="not_found",method="fail"}`:   1,
		`udskit_rpc_client_calls_total{code="ok",method="items"}`:         1,
		`udskit_rpc_client_call_duration_seconds_count{method="fail"}`:    1,
		`udskit_rpc_client_calls_in_flight`:                               0,
	} {
		if got := value(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// Durations are real: the sum is positive and below the test's time.
	if sum := value(t, body, `udskit_rpc_server_call_duration_seconds_sum{method="echo"}`); sum <= 0 || sum > 10 {
		t.Errorf("echo duration sum %v", sum)
	}
	for _, want := range []string{"# TYPE udskit_rpc_server_calls_total counter", "# TYPE udskit_rpc_server_call_duration_seconds histogram",
		"go_goroutines", "process_open_fds"} {
		if !strings.Contains(body, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	s.SetHealth("", rpc.HealthDraining)
	if v := value(t, scrape(t, url), "udskit_rpc_server_draining"); v != 1 {
		t.Errorf("draining after SetHealth draining: %v", v)
	}
}

// serveMetrics serves m's /metrics over HTTP on loopback for the test and
// returns its URL; the server stops when the test ends.
func serveMetrics(t *testing.T, m *rpcprom.Metrics) string {
	t.Helper()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: m.Handler()}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })
	return "http://" + hl.Addr().String() + "/metrics"
}

package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

var metricsAt = regexp.MustCompile(`msg="metrics at /metrics" addr=tcp:(\S+)`)

// metricsURL waits for the "metrics at" log line in log and returns the URL.
func metricsURL(t *testing.T, log *testutil.Buffer) string {
	t.Helper()
	waitLog(t, "udskit", log, "metrics at /metrics")
	m := metricsAt.FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("no metrics address in:\n%s", log)
	}
	return "http://" + m[1] + "/metrics"
}

// curlMetrics scrapes url with curl and returns the exposition.
func curlMetrics(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "-sSf", "--max-time", "20", url).Output()
	if err != nil {
		t.Fatalf("curl %s: %v", url, err)
	}
	return string(out)
}

// sample returns the value of series in body (-1 if absent).
func sample(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// `udskit serve --metrics`: calls by method and code, connections, and
// refusals by policy, scraped by curl.
func TestServeMetrics(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	srv := scServe(t, sock, "--metrics", "tcp:127.0.0.1:0", "--allow-uid", "0")
	url := metricsURL(t, srv.stderr)
	for _, args := range [][]string{{"call", sock, "echo", `"x"`}, {"call", sock, "echo", `"y"`}, {"call", sock, "fail", `{"code":"not_found"}`}} {
		scRun(t, "", args...)
	}
	if r := scRun(t, "", "health", sock); r.code != 0 {
		t.Fatalf("health: %+v", r)
	}
	// A second serve refusing root: its policy refusal is counted there.
	sock2 := filepath.Join(dir, "locked.sock")
	srv2 := scServe(t, sock2, "--metrics", "tcp:127.0.0.1:0", "--allow-uid", "12345")
	url2 := metricsURL(t, srv2.stderr)
	if r := scRun(t, "", "call", sock2, "echo", `"x"`); r.code != 1 {
		t.Fatalf("call refused by --allow-uid: %+v", r)
	}

	body := curlMetrics(t, url)
	for series, want := range map[string]float64{
		`udskit_rpc_server_calls_total{code="ok",method="echo"}`:          2,
		`udskit_rpc_server_calls_total{code="not_found",method="fail"}`:   1,
		`udskit_rpc_server_calls_total{code="ok",method="udskit.health"}`: 1,
		`udskit_rpc_server_call_duration_seconds_count{method="echo"}`:    2,
		`udskit_rpc_server_received_bytes_total`:                          3 + 3 + 20 + 2,
		`udskit_rpc_server_refused_connections_total{reason="policy"}`:    0,
		`udskit_rpc_server_draining`:                                      0,
	} {
		if got := sample(body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if sample(body, "udskit_rpc_server_connections") < 0 || sample(body, "process_resident_memory_bytes") <= 0 {
		t.Errorf("exposition lacks the connections gauge or the process collector:\n%s", body)
	}
	if got := sample(curlMetrics(t, url2), `udskit_rpc_server_refused_connections_total{reason="policy"}`); got != 1 {
		t.Errorf("policy refusals on the locked serve: %v, want 1", got)
	}

	// A bad --metrics address is bad usage.
	if r := scRun(t, "", "serve", filepath.Join(dir, "x.sock"), "--metrics", "udp:1.2.3.4:5"); r.code != 2 || !strings.Contains(r.stderr, `unknown scheme "udp"`) {
		t.Errorf("serve --metrics udp:...: %+v", r)
	}
}

// `udskit proxy --metrics`: connections, bytes each way, and draining while
// a connection holds the drain open.
func TestProxyMetrics(t *testing.T) {
	echo := pxEcho(t)
	front := filepath.Join(testutil.ShortDir(t, 0o700), "front.sock")
	p := pxStart(t, 1, "--listen", front, "--to", echo, "--metrics", "tcp:127.0.0.1:0", "--drain-timeout", "30s")
	url := metricsURL(t, p.stderr)
	c := pxDial(t, "unix:"+front)
	pxRoundTrip(t, c, "hello")
	c.Close()
	held := pxDial(t, "unix:"+front)
	pxRoundTrip(t, held, "held")
	// A finished connection's bytes are counted once its log line is out.
	pxWaitLog(t, p, "bytes_in=5")
	body := curlMetrics(t, url)
	for series, want := range map[string]float64{
		`udskit_proxy_connections_total`:                             2,
		`udskit_proxy_connections`:                                   1,
		`udskit_proxy_bytes_total{direction="to_upstream"}`:          5,
		`udskit_proxy_bytes_total{direction="to_client"}`:            5,
		`udskit_proxy_upstream_dial_failures_total`:                  0,
		`udskit_proxy_refused_connections_total{reason="policy"}`:    0,
		`udskit_proxy_refused_connections_total{reason="max_conns"}`: 0,
		`udskit_proxy_draining`:                                      0,
	} {
		if got := sample(body, series); got != want {
			t.Errorf("%s = %v, want %v\n", series, got, want)
		}
	}
	p.signal(syscall.SIGTERM)
	pxWaitLog(t, p, "proxy draining")
	if got := sample(curlMetrics(t, url), "udskit_proxy_draining"); got != 1 {
		t.Errorf("udskit_proxy_draining during the drain: %v, want 1", got)
	}
	held.Close()
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("proxy exit: %v", err)
	}
	// The endpoint goes with the process.
	if c, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics"), time.Second); err == nil {
		c.Close()
		t.Error("the metrics endpoint still accepts after the proxy exited")
	}
}

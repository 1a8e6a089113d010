package proxyprom_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	utest "github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/proxy/proxyprom"
	"github.com/udskit/udskit/uds"
)

// A proxy relaying one echo connection, one refused by the listener's
// policy, then draining: the collector reports each.
func TestCollector(t *testing.T) {
	dir := utest.ShortDir(t, 0o700)
	echo := filepath.Join(dir, "echo.sock")
	utest.Serve(t, utest.ListenUnix(t, echo), utest.Echo)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	open, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "front.sock"), uds.ListenOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	locked, err := uds.Listen(context.Background(), "unix:"+filepath.Join(dir, "locked.sock"),
		uds.ListenOptions{Logger: quiet, Policy: uds.AllowUIDs(12345)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New([]proxy.Route{{Listen: open.UAddr().String(), To: echo}, {Listen: locked.UAddr().String(), To: echo}},
		[]proxy.Listener{open, locked}, proxy.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve()
	defer p.Close()
	c := proxyprom.New(prometheus.Labels{"sidecar": "test"})
	c.Watch(p, open, locked)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	conn, err := net.Dial("unix", filepath.Join(dir, "front.sock"))
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if lc, err := net.Dial("unix", filepath.Join(dir, "locked.sock")); err == nil {
		lc.SetReadDeadline(time.Now().Add(10 * time.Second))
		lc.Read(buf) // closed by the policy
		lc.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().BytesIn != 5 || locked.Refused() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, refused %d", p.Stats(), locked.Refused())
		}
		time.Sleep(5 * time.Millisecond)
	}
	want := `
# HELP udskit_proxy_bytes_total Bytes relayed by finished connections, by direction.
# TYPE udskit_proxy_bytes_total counter
udskit_proxy_bytes_total{direction="to_client",sidecar="test"} 5
udskit_proxy_bytes_total{direction="to_upstream",sidecar="test"} 5
# HELP udskit_proxy_connections_total Client connections accepted since start.
# TYPE udskit_proxy_connections_total counter
udskit_proxy_connections_total{sidecar="test"} 1
# HELP udskit_proxy_refused_connections_total Client connections refused: by the peer-credential policy (reason=policy) or the connection limit (reason=max_conns).
# TYPE udskit_proxy_refused_connections_total counter
udskit_proxy_refused_connections_total{reason="max_conns",sidecar="test"} 0
udskit_proxy_refused_connections_total{reason="policy",sidecar="test"} 1
# HELP udskit_proxy_draining 1 once the proxy has started to drain (either mode), else 0.
# TYPE udskit_proxy_draining gauge
udskit_proxy_draining{sidecar="test"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), proxyprom.Bytes, proxyprom.ConnsTotal, proxyprom.Refused, proxyprom.DrainingNow); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.Shutdown(ctx)
	if v := testutil.ToFloat64(gaugeOf(t, reg, proxyprom.DrainingNow)); v != 1 {
		t.Fatalf("draining after Shutdown: %v", v)
	}
}

// gaugeOf returns a collector for the one sample of name in reg.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

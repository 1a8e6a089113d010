package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/spf13/pflag"

	"github.com/udskit/udskit/demo"
	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/proxy/proxyprom"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcprom"
	"github.com/udskit/udskit/uds"
)

// metricsFlagHelp is the --metrics flag's help, for serve and proxy.
const metricsFlagHelp = "serve Prometheus metrics at http://ADDR/metrics (e.g. tcp:127.0.0.1:9464, or a unix socket path, owner-only)"

func addMetricsFlag(f *pflag.FlagSet, addr *string) {
	f.StringVar(addr, "metrics", "", metricsFlagHelp)
}

// cliMetrics is the --metrics endpoint of serve and proxy. A nil
// *cliMetrics (no --metrics) does nothing.
type cliMetrics struct {
	rpc   *rpcprom.Metrics
	proxy *proxyprom.Collector
	srv   *http.Server
	addr  string
	done  chan struct{}
}

// startMetrics listens on addr (bad usage if it does not parse) and serves
// /metrics from a registry with the Go and process collectors; nil when
// addr is "".
func startMetrics(ctx context.Context, addr string, log *slog.Logger) (*cliMetrics, error) {
	if addr == "" {
		return nil, nil
	}
	if _, err := parseAddr(addr); err != nil {
		return nil, err
	}
	l, err := uds.Listen(ctx, addr, uds.ListenOptions{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	m := &cliMetrics{rpc: rpcprom.New(rpcprom.Options{}), proxy: proxyprom.New(nil), done: make(chan struct{})}
	m.rpc.Registry().MustRegister(m.proxy)
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.rpc.Handler())
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	m.addr = l.UAddr().String()
	if a := l.UAddr(); a.Kind == uds.TCP {
		m.addr = "tcp:" + l.Addr().String()
	}
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "addr", m.addr, "err", err)
		}
	}()
	log.Info("metrics at /metrics", "addr", m.addr)
	return m, nil
}

// close stops the endpoint.
func (m *cliMetrics) close() {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.srv.Shutdown(ctx)
	<-m.done
}

// serverOptions adds the rpc metrics interceptors.
func (m *cliMetrics) serverOptions(o rpc.ServerOptions) rpc.ServerOptions {
	if m == nil {
		return o
	}
	return m.rpc.ServerOptions(o)
}

// watchServe exports a serve's connections, refusals and drain.
func (m *cliMetrics) watchServe(s *demo.Server, l rpcprom.Refuser) {
	if m == nil {
		return
	}
	m.rpc.WatchServer(s.RPC)
	m.rpc.WatchMaxConns(s)
	m.rpc.WatchListener(l)
}

// watchProxy exports a proxy's counters and its listeners' refusals.
func (m *cliMetrics) watchProxy(p *proxy.Proxy, ls []proxy.Listener) {
	if m == nil {
		return
	}
	rs := make([]proxyprom.Refuser, 0, len(ls))
	for _, l := range ls {
		if r, ok := l.(proxyprom.Refuser); ok {
			rs = append(rs, r)
		}
	}
	m.proxy.Watch(p, rs...)
}

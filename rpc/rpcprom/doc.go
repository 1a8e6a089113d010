// Package rpcprom exports udskit rpc metrics to Prometheus
// (github.com/prometheus/client_golang): per-method call counts by code,
// latency histograms, calls in flight, payload bytes, open connections,
// connections refused (by the peer policy, by the connection limit), and
// whether the server is draining. It is opt-in: package rpc does not import
// it, and a server without it pays nothing.
//
//	m := rpcprom.New(rpcprom.Options{})
//	s := rpc.NewServer(m.ServerOptions(rpc.ServerOptions{})) // installs the interceptors
//	m.WatchServer(s)   // connections, max-conns refusals, draining
//	m.WatchListener(l) // policy refusals of a *uds.Listener
//	http.Handle("/metrics", m.Handler())
//
// Metric names follow Prometheus conventions (base units, _total for
// counters, _seconds for durations); see Names. Clients get the same call
// metrics under udskit_rpc_client_ with m.ClientOptions.
package rpcprom

// Package proxyprom exports a udskit proxy's counters to Prometheus
// (github.com/prometheus/client_golang), read from proxy.Proxy.Stats and
// its listeners at each scrape: connections open and accepted, upstream
// dial failures, bytes each way, connections refused (by the peer policy,
// by the connection limit), and whether the proxy is draining. Opt-in:
// package proxy does not import it. `udskit proxy --metrics ADDR` uses it.
//
//	c := proxyprom.New(nil)
//	reg.MustRegister(c)
//	c.Watch(p, listeners...) // after proxy.New
package proxyprom

package proxyprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/udskit/udskit/proxy"
)

// Names of the metrics.
const (
	Conns       = "udskit_proxy_connections"                  // gauge
	ConnsTotal  = "udskit_proxy_connections_total"            // counter
	DialFails   = "udskit_proxy_upstream_dial_failures_total" // counter
	Bytes       = "udskit_proxy_bytes_total"                  // counter {direction: to_upstream|to_client}
	Refused     = "udskit_proxy_refused_connections_total"    // counter {reason: policy|max_conns}
	DrainingNow = "udskit_proxy_draining"                     // gauge 0/1
)

// Refuser is a listener that counts the peers its policy refused
// (*uds.Listener, *handoff.Listener).
type Refuser interface{ Refused() uint64 }

// Collector is a prometheus.Collector for proxies. Create it with New.
type Collector struct {
	conns, total, fails, bytes, refused, draining *prometheus.Desc

	mu        sync.Mutex
	proxies   []*proxy.Proxy
	listeners []Refuser
}

// New returns a Collector; constLabels (may be nil) go on every metric.
func New(constLabels prometheus.Labels) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, constLabels)
	}
	return &Collector{
		conns:    d(Conns, "Connections being proxied now."),
		total:    d(ConnsTotal, "Client connections accepted since start."),
		fails:    d(DialFails, "Client connections whose upstream dial failed."),
		bytes:    d(Bytes, "Bytes relayed by finished connections, by direction.", "direction"),
		refused:  d(Refused, "Client connections refused: by the peer-credential policy (reason=policy) or the connection limit (reason=max_conns).", "reason"),
		draining: d(DrainingNow, "1 once the proxy has started to drain (either mode), else 0."),
	}
}

// Watch adds p and the listeners it serves.
func (c *Collector) Watch(p *proxy.Proxy, listeners ...Refuser) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.proxies = append(c.proxies, p)
	c.listeners = append(c.listeners, listeners...)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.total, c.fails, c.bytes, c.refused, c.draining} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	proxies := append([]*proxy.Proxy(nil), c.proxies...)
	listeners := append([]Refuser(nil), c.listeners...)
	c.mu.Unlock()
	var st proxy.Stats
	draining := 0.0
	for _, p := range proxies {
		s := p.Stats()
		st.Active += s.Active
		st.Total += s.Total
		st.Failed += s.Failed
		st.BytesIn += s.BytesIn
		st.BytesOut += s.BytesOut
		st.Rejected += s.Rejected
		if s.Draining {
			draining = 1
		}
	}
	var policy uint64
	for _, l := range listeners {
		policy += l.Refused()
	}
	g, k := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(c.conns, g, float64(st.Active))
	ch <- prometheus.MustNewConstMetric(c.total, k, float64(st.Total))
	ch <- prometheus.MustNewConstMetric(c.fails, k, float64(st.Failed))
	ch <- prometheus.MustNewConstMetric(c.bytes, k, float64(st.BytesIn), "to_upstream")
	ch <- prometheus.MustNewConstMetric(c.bytes, k, float64(st.BytesOut), "to_client")
	ch <- prometheus.MustNewConstMetric(c.refused, k, float64(policy), "policy")
	ch <- prometheus.MustNewConstMetric(c.refused, k, float64(st.Rejected), "max_conns")
	ch <- prometheus.MustNewConstMetric(c.draining, g, draining)
}

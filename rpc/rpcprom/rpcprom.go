package rpcprom

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/udskit/udskit/rpc"
)

// Options configures New. The zero value is the usual set-up: a registry of
// its own, with the Go runtime and process collectors.
type Options struct {
	// Registry receives the metrics. Default: a new registry with the Go
	// and process collectors (Handler serves it).
	Registry *prometheus.Registry
	// Buckets are the latency histogram's upper bounds, in seconds. Default
	// DefaultBuckets.
	Buckets []float64
	// ConstLabels are added to every metric (e.g. {"service": "sidecar"}).
	ConstLabels prometheus.Labels
}

// DefaultBuckets span a unix-socket round trip (tens of microseconds) to a
// slow handler (10 s).
var DefaultBuckets = []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10}

// Names of the metrics this package exports.
const (
	ServerCalls       = "udskit_rpc_server_calls_total"               // counter {method, code}
	ServerDuration    = "udskit_rpc_server_call_duration_seconds"     // histogram {method}
	ServerInFlight    = "udskit_rpc_server_calls_in_flight"           // gauge
	ServerRecvBytes   = "udskit_rpc_server_received_bytes_total"      // counter: request payloads
	ServerSentBytes   = "udskit_rpc_server_sent_bytes_total"          // counter: response payloads and stream items
	ServerStreamItems = "udskit_rpc_server_stream_items_total"        // counter {method}
	ServerConns       = "udskit_rpc_server_connections"               // gauge (WatchServer)
	ServerRefused     = "udskit_rpc_server_refused_connections_total" // counter {reason: policy|max_conns} (WatchServer, WatchListener)
	ServerDraining    = "udskit_rpc_server_draining"                  // gauge 0/1 (WatchServer)
	ClientCalls       = "udskit_rpc_client_calls_total"               // counter {method, code}
	ClientDuration    = "udskit_rpc_client_call_duration_seconds"     // histogram {method}
	ClientInFlight    = "udskit_rpc_client_calls_in_flight"           // gauge

	// ServerRefusedCalls counts calls refused before any handler or
	// interceptor ran (so not in ServerCalls): {reason: unknown_method|
	// wrong_kind|draining|in_flight, code}. No method label: an unknown
	// method's name is whatever a client sent.
	ServerRefusedCalls = "udskit_rpc_server_refused_calls_total"

	// The shared-memory data path (WatchServer; rpc.Server.Stats, what
	// udskit.stats answers). Fill level: in_use / capacity.
	ServerShmConns    = "udskit_rpc_server_shm_connections"     // gauge: open connections with a region
	ServerShmInUse    = "udskit_rpc_server_shm_bytes_in_use"    // gauge: bytes of the server's halves not yet released
	ServerShmCapacity = "udskit_rpc_server_shm_bytes_capacity"  // gauge: the server's halves' size
	ServerShmPayloads = "udskit_rpc_server_shm_payloads_total"  // counter {direction: sent|received}
	ServerShmWaits    = "udskit_rpc_server_shm_waits_total"     // counter: payloads that waited for space (back-pressure)
	ServerShmOverHalf = "udskit_rpc_server_shm_over_half_total" // counter: payloads larger than a half, sent on the socket
	ServerShmStalled  = "udskit_rpc_server_shm_stalled_total"   // counter: answers sent on the socket while the reader waited for budget

	// Call slots (ClientOptions.ShmCalls, protocol/spec.md 10.8; WatchServer).
	ServerShmSlotCalls     = "udskit_rpc_server_shm_slot_calls_total"     // counter: unary calls answered through a call slot
	ServerShmAreaBytes     = "udskit_rpc_server_shm_area_bytes_total"     // counter {direction: sent|received}: payload bytes in the slots' payload areas
	ServerShmSpuriousWakes = "udskit_rpc_server_shm_spurious_wakes_total" // counter: poller wake-ups that found nothing changed
)

// Metrics holds the collectors. Create it with New.
type Metrics struct {
	reg *prometheus.Registry

	srv, cli         *side
	srvRecv, srvSent atomic.Uint64 // exported by CounterFuncs: an integer add per call
	srvItems         *prometheus.CounterVec
	srvRefusedCalls  *prometheus.CounterVec

	watchMu   sync.Mutex
	servers   []*rpc.Server
	listeners []Refuser
	limits    []interface{ Rejected() uint64 }
}

// side is the call metrics of one side (server or client).
type side struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight atomic.Int64                       // exported by a GaugeFunc
	methods  atomic.Pointer[map[string]*method] // copy-on-write cache
	mu       sync.Mutex
}

// method caches one method's children, so a call does no label hashing.
type method struct {
	duration prometheus.Observer
	codes    [rpc.ProtocolViolation + 1]atomic.Pointer[prometheus.Counter]
	items    prometheus.Counter // server streams only
}

// New returns Metrics registered on opts.Registry (or a new one).
func New(opts Options) *Metrics {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if opts.Buckets == nil {
		opts.Buckets = DefaultBuckets
	}
	cl := opts.ConstLabels
	m := &Metrics{reg: reg}
	m.srv = newSide(reg, "server", opts.Buckets, cl)
	m.cli = newSide(reg, "client", opts.Buckets, cl)
	recv := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: ServerRecvBytes, ConstLabels: cl,
		Help: "Request payload bytes received by the server's handlers."}, func() float64 { return float64(m.srvRecv.Load()) })
	sent := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: ServerSentBytes, ConstLabels: cl,
		Help: "Response payload and stream item bytes the server's handlers sent."}, func() float64 { return float64(m.srvSent.Load()) })
	m.srvItems = prometheus.NewCounterVec(prometheus.CounterOpts{Name: ServerStreamItems, ConstLabels: cl,
		Help: "Stream items sent by server-streaming handlers."}, []string{"method"})
	m.srvRefusedCalls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: ServerRefusedCalls, ConstLabels: cl,
		Help: "Calls the server refused before any handler ran (unknown method, wrong kind, draining, too many in flight on a connection)."},
		[]string{"reason", "code"})
	reg.MustRegister(recv, sent, m.srvItems, m.srvRefusedCalls, &watched{m: m, cl: cl})
	return m
}

func newSide(reg *prometheus.Registry, name string, buckets []float64, cl prometheus.Labels) *side {
	s := &side{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "udskit_rpc_" + name + "_calls_total", ConstLabels: cl,
			Help: "Calls finished, by method and code (ok, not_found, ...)."}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "udskit_rpc_" + name + "_call_duration_seconds", ConstLabels: cl,
			Help: "Call latency in seconds, by method (streams: until the stream ends).", Buckets: buckets}, []string{"method"}),
	}
	inFlight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "udskit_rpc_" + name + "_calls_in_flight", ConstLabels: cl,
		Help: "Calls started and not finished."}, func() float64 { return float64(s.inFlight.Load()) })
	empty := map[string]*method{}
	s.methods.Store(&empty)
	reg.MustRegister(s.calls, s.duration, inFlight)
	return s
}

// Registry returns the registry the metrics are on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func (s *side) method(name string, items *prometheus.CounterVec) *method {
	if mm := (*s.methods.Load())[name]; mm != nil {
		return mm
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.methods.Load()
	if mm := old[name]; mm != nil {
		return mm
	}
	mm := &method{duration: s.duration.WithLabelValues(name)}
	if items != nil {
		mm.items = items.WithLabelValues(name)
	}
	next := make(map[string]*method, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = mm
	s.methods.Store(&next)
	return mm
}

func (s *side) done(name string, mm *method, err error, start time.Time) {
	mm.duration.Observe(time.Since(start).Seconds())
	code := rpc.CodeOf(err)
	if int(code) < len(mm.codes) {
		if c := mm.codes[code].Load(); c != nil {
			(*c).Inc()
		} else {
			c := s.calls.WithLabelValues(name, code.String())
			mm.codes[code].Store(&c)
			c.Inc()
		}
	} else {
		s.calls.WithLabelValues(name, code.String()).Inc()
	}
	s.inFlight.Add(-1)
}

// UnaryServerInterceptor counts and times unary calls (NDJSON ones too).
func (m *Metrics) UnaryServerInterceptor() rpc.UnaryServerInterceptor {
	return func(ctx context.Context, info rpc.CallInfo, req, dst []byte, next rpc.RawHandler) ([]byte, error) {
		mm := m.srv.method(info.Method, nil)
		m.srv.inFlight.Add(1)
		m.srvRecv.Add(uint64(len(req)))
		start := time.Now()
		out, err := next(ctx, req, dst)
		if err == nil {
			m.srvSent.Add(uint64(len(out)))
		}
		m.srv.done(info.Method, mm, err, start)
		return out, err
	}
}

// StreamServerInterceptor counts and times server-streaming calls and
// their items.
func (m *Metrics) StreamServerInterceptor() rpc.StreamServerInterceptor {
	return func(ctx context.Context, info rpc.CallInfo, req []byte, send func([]byte) error, next rpc.RawStreamHandler) error {
		mm := m.srv.method(info.Method, m.srvItems)
		m.srv.inFlight.Add(1)
		m.srvRecv.Add(uint64(len(req)))
		start := time.Now()
		err := next(ctx, req, func(b []byte) error {
			err := send(b)
			if err == nil {
				mm.items.Inc()
				m.srvSent.Add(uint64(len(b)))
			}
			return err
		})
		m.srv.done(info.Method, mm, err, start)
		return err
	}
}

// ServerOptions returns opts with the metrics interceptors added (outermost)
// and OnRefused counting refused calls (then calling opts' own, if set).
func (m *Metrics) ServerOptions(opts rpc.ServerOptions) rpc.ServerOptions {
	opts.UnaryInterceptors = append([]rpc.UnaryServerInterceptor{m.UnaryServerInterceptor()}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]rpc.StreamServerInterceptor{m.StreamServerInterceptor()}, opts.StreamInterceptors...)
	next := opts.OnRefused
	opts.OnRefused = func(rc rpc.RefusedCall) {
		m.Refused(rc)
		if next != nil {
			next(rc)
		}
	}
	return opts
}

// Refused counts a call the server refused before any handler ran; use it
// as rpc.ServerOptions.OnRefused when not using ServerOptions.
func (m *Metrics) Refused(rc rpc.RefusedCall) {
	m.srvRefusedCalls.WithLabelValues(string(rc.Reason), rc.Code.String()).Inc()
}

// UnaryClientInterceptor counts and times a client's unary calls.
func (m *Metrics) UnaryClientInterceptor() rpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, dst []byte, invoke rpc.UnaryInvoker) ([]byte, error) {
		mm := m.cli.method(method, nil)
		m.cli.inFlight.Add(1)
		start := time.Now()
		out, err := invoke(ctx, method, req, dst)
		m.cli.done(method, mm, err, start)
		return out, err
	}
}

// StreamClientInterceptor counts and times a client's streams, until each
// ends.
func (m *Metrics) StreamClientInterceptor() rpc.StreamClientInterceptor {
	return func(ctx context.Context, method string, req []byte, open rpc.StreamOpener) (*rpc.ClientStream, error) {
		mm := m.cli.method(method, nil)
		m.cli.inFlight.Add(1)
		start := time.Now()
		st, err := open(ctx, method, req)
		if err != nil {
			m.cli.done(method, mm, err, start)
			return nil, err
		}
		st.OnDone(func(err error) { m.cli.done(method, mm, err, start) })
		return st, nil
	}
}

// ClientOptions returns opts with the client metrics interceptors added.
func (m *Metrics) ClientOptions(opts rpc.ClientOptions) rpc.ClientOptions {
	opts.UnaryInterceptors = append([]rpc.UnaryClientInterceptor{m.UnaryClientInterceptor()}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]rpc.StreamClientInterceptor{m.StreamClientInterceptor()}, opts.StreamInterceptors...)
	return opts
}

// Refuser is a listener that counts the peers its policy refused
// (*uds.Listener).
type Refuser interface{ Refused() uint64 }

// WatchServer exports s's open connections, the connections its
// connection limit refused, whether it is draining and its shared-memory
// path (ServerShm*: regions, fill level, payloads, waits, stalled answers), read at each
// scrape.
func (m *Metrics) WatchServer(s *rpc.Server) {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	m.servers = append(m.servers, s)
}

// WatchMaxConns exports the connections an accept loop other than the
// server's own refused at its connection limit (a *uds.Server, a
// demo.Server): reason max_conns, read at each scrape.
func (m *Metrics) WatchMaxConns(r interface{ Rejected() uint64 }) {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	m.limits = append(m.limits, r)
}

// WatchListener exports the peers l's policy refused, read at each scrape.
func (m *Metrics) WatchListener(l Refuser) {
	m.watchMu.Lock()
	defer m.watchMu.Unlock()
	m.listeners = append(m.listeners, l)
}

// watched collects what WatchServer and WatchListener registered.
type watched struct {
	m  *Metrics
	cl prometheus.Labels
}

var (
	descHelpConns    = "Connections the server is serving."
	descHelpRefused  = "Connections refused: by the peer-credential policy (reason=policy) or the connection limit (reason=max_conns)."
	descHelpDraining = "1 while the server drains (udskit.health reports draining), else 0."
)

func (w *watched) descs() (conns, refused, draining *prometheus.Desc) {
	return prometheus.NewDesc(ServerConns, descHelpConns, nil, w.cl),
		prometheus.NewDesc(ServerRefused, descHelpRefused, []string{"reason"}, w.cl),
		prometheus.NewDesc(ServerDraining, descHelpDraining, nil, w.cl)
}

func (w *watched) Describe(ch chan<- *prometheus.Desc) {
	a, b, c := w.descs()
	ch <- a
	ch <- b
	ch <- c
	for _, d := range w.shmDescs() {
		ch <- d
	}
}

// shmDescs: connections, in use, capacity, payloads, waits, over half,
// stalled, slot calls, area bytes, spurious wake-ups.
func (w *watched) shmDescs() [10]*prometheus.Desc {
	return [10]*prometheus.Desc{
		prometheus.NewDesc(ServerShmConns, "Open connections using a shared-memory region (one each).", nil, w.cl),
		prometheus.NewDesc(ServerShmInUse, "Bytes of the server's halves of the shared-memory regions held by payloads the clients have not yet released (fill level: divide by capacity).", nil, w.cl),
		prometheus.NewDesc(ServerShmCapacity, "Total size in bytes of the server's halves of the shared-memory regions.", nil, w.cl),
		prometheus.NewDesc(ServerShmPayloads, "Payloads that went through a shared-memory region: sent (responses, stream items), received (requests).", []string{"direction"}, w.cl),
		prometheus.NewDesc(ServerShmWaits, "Payloads that waited for space in a full shared-memory half (back-pressure).", nil, w.cl),
		prometheus.NewDesc(ServerShmOverHalf, "Payloads larger than a shared-memory half, sent on the socket instead.", nil, w.cl),
		prometheus.NewDesc(ServerShmStalled, "Answers sent on the socket because the shared-memory half was full while the connection's reader waited for its memory budget (raise MaxConnBytes or spread large calls).", nil, w.cl),
		prometheus.NewDesc(ServerShmSlotCalls, "Unary calls answered through a shared-memory call slot (ClientOptions.ShmCalls).", nil, w.cl),
		prometheus.NewDesc(ServerShmAreaBytes, "Payload bytes carried in the call slots' payload areas: sent (answers), received (requests); those payloads also count in the payloads counter.", []string{"direction"}, w.cl),
		prometheus.NewDesc(ServerShmSpuriousWakes, "Wake-ups of the call-slot pollers that found nothing changed (a few are races; a client flooding FUTEX_WAKE has its connection ended).", nil, w.cl),
	}
}

func (w *watched) Collect(ch chan<- prometheus.Metric) {
	w.m.watchMu.Lock()
	servers := append([]*rpc.Server(nil), w.m.servers...)
	listeners := append([]Refuser(nil), w.m.listeners...)
	limits := append([]interface{ Rejected() uint64 }(nil), w.m.limits...)
	w.m.watchMu.Unlock()
	dConns, dRefused, dDraining := w.descs()
	var conns, full, policy, draining float64
	var sh rpc.ShmServerStats
	for _, s := range servers {
		st := s.Stats()
		conns += float64(st.Conns)
		sh.Conns += st.Shm.Conns
		sh.InUse += st.Shm.InUse
		sh.Capacity += st.Shm.Capacity
		sh.Sent += st.Shm.Sent
		sh.Received += st.Shm.Received
		sh.Waits += st.Shm.Waits
		sh.OverHalf += st.Shm.OverHalf
		sh.Stalled += st.Shm.Stalled
		sh.SlotCalls += st.Shm.SlotCalls
		sh.AreaSentBytes += st.Shm.AreaSentBytes
		sh.AreaReceivedBytes += st.Shm.AreaReceivedBytes
		sh.SpuriousWakes += st.Shm.SpuriousWakes
		full += float64(s.Rejected())
		if st, _ := s.Health(""); st == rpc.HealthDraining {
			draining = 1
		}
	}
	for _, l := range listeners {
		policy += float64(l.Refused())
	}
	for _, l := range limits {
		full += float64(l.Rejected())
	}
	ch <- prometheus.MustNewConstMetric(dConns, prometheus.GaugeValue, conns)
	ch <- prometheus.MustNewConstMetric(dRefused, prometheus.CounterValue, policy, "policy")
	ch <- prometheus.MustNewConstMetric(dRefused, prometheus.CounterValue, full, "max_conns")
	ch <- prometheus.MustNewConstMetric(dDraining, prometheus.GaugeValue, draining)
	d := w.shmDescs()
	ch <- prometheus.MustNewConstMetric(d[0], prometheus.GaugeValue, float64(sh.Conns))
	ch <- prometheus.MustNewConstMetric(d[1], prometheus.GaugeValue, float64(sh.InUse))
	ch <- prometheus.MustNewConstMetric(d[2], prometheus.GaugeValue, float64(sh.Capacity))
	ch <- prometheus.MustNewConstMetric(d[3], prometheus.CounterValue, float64(sh.Sent), "sent")
	ch <- prometheus.MustNewConstMetric(d[3], prometheus.CounterValue, float64(sh.Received), "received")
	ch <- prometheus.MustNewConstMetric(d[4], prometheus.CounterValue, float64(sh.Waits))
	ch <- prometheus.MustNewConstMetric(d[5], prometheus.CounterValue, float64(sh.OverHalf))
	ch <- prometheus.MustNewConstMetric(d[6], prometheus.CounterValue, float64(sh.Stalled))
	ch <- prometheus.MustNewConstMetric(d[7], prometheus.CounterValue, float64(sh.SlotCalls))
	ch <- prometheus.MustNewConstMetric(d[8], prometheus.CounterValue, float64(sh.AreaSentBytes), "sent")
	ch <- prometheus.MustNewConstMetric(d[8], prometheus.CounterValue, float64(sh.AreaReceivedBytes), "received")
	ch <- prometheus.MustNewConstMetric(d[9], prometheus.CounterValue, float64(sh.SpuriousWakes))
}

package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Standard methods (protocol/spec.md, "Standard methods"): method names that
// start with StdPrefix belong to udskit; every Server answers them without
// registration. They are not listed by Methods.
const StdPrefix = "udskit."

// HealthMethod is the standard health check: request {} or
// {"service":"NAME"}, response {"status":"serving"|"draining"|"not_serving"};
// an unknown service name fails with NotFound. `udskit health ADDR` turns it
// into an exit code for Kubernetes exec probes and systemd ExecStartPost.
const HealthMethod = StdPrefix + "health"

// HealthStatus is what the health method reports for a server or a service.
type HealthStatus string

// Health statuses, as on the wire.
const (
	HealthServing    HealthStatus = "serving"
	HealthNotServing HealthStatus = "not_serving"
	// HealthDraining: the server is stopping (Shutdown has started, or the
	// whole server was set draining, as a linger drain does while it still
	// serves). Probes treat it as not ready.
	HealthDraining HealthStatus = "draining"
)

// maxHealthRequest caps the health request the server decodes: a service
// name and braces, nothing more.
const maxHealthRequest = 4 << 10

// healthState holds the statuses set with SetHealth. The whole server ("")
// is serving unless set otherwise; a named service is known once set.
type healthState struct {
	mu       sync.Mutex
	server   HealthStatus
	services map[string]HealthStatus
}

// SetHealth sets the status the health method reports for service; "" is
// the whole server, which is serving until set otherwise. A named service is
// known to the health method once set (until then a probe for it gets
// NotFound). The whole server's status overrides a service's when it is not
// serving: a server set (or shutting down) draining reports draining for
// every service, one set not_serving reports not_serving for every service
// that is not draining. Setting the whole server HealthDraining is how a
// drain that keeps serving (a linger drain) tells probes it is going away;
// Shutdown needs no call: it reports draining from its first moment.
func (s *Server) SetHealth(service string, status HealthStatus) {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if service == "" {
		h.server = status
		return
	}
	if h.services == nil {
		h.services = map[string]HealthStatus{}
	}
	h.services[service] = status
}

// RemoveHealth forgets a service set with SetHealth: the health method
// answers NotFound for it again.
func (s *Server) RemoveHealth(service string) {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.services, service)
}

// Health returns what the health method answers for service ("" for the
// whole server): an *Error with Code NotFound for a service never set.
func (s *Server) Health(service string) (HealthStatus, error) {
	shuttingDown := s.Draining() // Shutdown, Close or a linger drain (Linger) started
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	st, known := h.services[service]
	if service != "" && !known {
		return "", Errorf(NotFound, "unknown service %q (a server reports the services it set with SetHealth)", service)
	}
	srv := h.server
	if srv == "" {
		srv = HealthServing
	}
	switch {
	case shuttingDown || srv == HealthDraining:
		return HealthDraining, nil
	case service == "":
		return srv, nil
	case st == HealthDraining:
		return st, nil
	case srv == HealthNotServing:
		return HealthNotServing, nil
	}
	return st, nil
}

type healthRequest struct {
	Service string `json:"service"`
}

type healthResponse struct {
	Status HealthStatus `json:"status"`
}

// healthHandler answers the health method. An empty request is {}.
func (s *Server) healthHandler(_ context.Context, in, dst []byte) ([]byte, error) {
	var req healthRequest
	if len(in) > maxHealthRequest {
		return nil, Errorf(InvalidArgument, "%s request of %d bytes is over %d", HealthMethod, len(in), maxHealthRequest)
	}
	if t := bytes.TrimSpace(in); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &req); err != nil {
			return nil, Errorf(InvalidArgument, `decode %s request: want {} or {"service":"NAME"}: %v`, HealthMethod, err)
		}
	}
	st, err := s.Health(req.Service)
	if err != nil {
		return nil, err
	}
	return JSON.Marshal(dst, healthResponse{Status: st})
}

// registerStd registers the standard methods (NewServer calls it).
func (s *Server) registerStd() {
	s.register(&handler{name: HealthMethod, unary: s.healthHandler, codec: "json", std: true})
	s.register(&handler{name: MethodsMethod, unary: s.methodsHandler, codec: "json", std: true}) // methods.go
	s.register(&handler{name: StatsMethod, unary: s.statsHandler, codec: "json", std: true})     // shm_stats.go
}

// CheckHealth calls the health method on c for service ("" for the whole
// server) and returns the status. A server too old to know the method fails
// with Unimplemented.
func CheckHealth(ctx context.Context, c *Client, service string) (HealthStatus, error) {
	var resp healthResponse
	var req any = struct{}{}
	if service != "" {
		req = healthRequest{Service: service}
	}
	if err := c.Call(ctx, HealthMethod, req, &resp); err != nil {
		return "", err
	}
	switch resp.Status {
	case HealthServing, HealthDraining, HealthNotServing:
		return resp.Status, nil
	}
	return "", Errorf(Internal, "%s answered an unknown status %q", HealthMethod, resp.Status)
}

// ProbeOptions configures ProbeHealth.
type ProbeOptions struct {
	// Service is the service to ask about; "" is the whole server.
	Service string
	// Wait keeps trying (the socket may not exist yet, the server may not be
	// serving yet) until the status is serving or ctx ends; without it
	// ProbeHealth makes one attempt.
	Wait bool
	// Interval is the pause between attempts with Wait. Default 100ms.
	Interval time.Duration
	// Client is what each attempt dials with: TLS for a tls: address, SSH
	// for ssh://. NoReconnect is set whatever it says; Wait is ProbeOptions'.
	Client ClientOptions
}

// ProbeError is a probe that got no status: the server could not be
// reached, or it answered the health method with an error (an unknown
// service: NotFound; a server without the method: Unimplemented).
type ProbeError struct {
	Addr string
	// Unreachable is set when no connection could be made (nothing listens,
	// no socket file, refused by the server's peer policy).
	Unreachable bool
	Err         error
}

func (e *ProbeError) Error() string {
	if e.Unreachable {
		return "unreachable: " + e.Addr + ": " + e.Err.Error()
	}
	return e.Addr + ": " + e.Err.Error()
}

func (e *ProbeError) Unwrap() error { return e.Err }

// ProbeHealth dials addr, calls the health method once (or, with Wait,
// until it answers serving or ctx ends) and returns the last status. It is
// what `udskit health` runs: serving is healthy; draining, not_serving and a
// *ProbeError are not.
func ProbeHealth(ctx context.Context, addr string, opts ProbeOptions) (HealthStatus, error) {
	interval := opts.Interval
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	for {
		st, err := probeOnce(ctx, addr, opts.Service, opts.Client)
		if !opts.Wait || st == HealthServing {
			return st, err
		}
		// Not found and unimplemented will not change by waiting.
		if c := CodeOf(err); err != nil && (c == NotFound || c == Unimplemented || c == InvalidArgument) {
			return st, err
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil && st == "" {
				err = &ProbeError{Addr: addr, Unreachable: true, Err: ctx.Err()}
			}
			return st, err
		case <-t.C:
		}
	}
}

func probeOnce(ctx context.Context, addr, service string, copts ClientOptions) (HealthStatus, error) {
	copts.NoReconnect, copts.Wait = true, false
	c, err := Dial(ctx, addr, copts)
	if err != nil {
		return "", &ProbeError{Addr: addr, Unreachable: true, Err: err}
	}
	defer c.Close()
	st, err := CheckHealth(ctx, c, service)
	if err != nil {
		if CodeOf(err) == Unimplemented {
			err = fmt.Errorf("%w (the server predates %s: check it with udskit call instead)", err, HealthMethod)
		}
		return "", &ProbeError{Addr: addr, Unreachable: CodeOf(err) == Unavailable, Err: err}
	}
	return st, nil
}

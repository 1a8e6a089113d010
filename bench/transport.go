package bench

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
)

// Caller makes one request at a time. Run gives each concurrent caller
// goroutine its own Caller; Call sends payload and waits for the full echo,
// which it returns (valid until the next Call; Run checks it byte for byte on
// each caller's first warm-up request and its length on every request).
type Caller interface {
	Call(ctx context.Context, payload []byte) ([]byte, error)
}

// Client is the client side of one transport at one concurrency: Callers has
// exactly the requested number of entries (they may share a connection).
type Client struct {
	Callers []Caller
	Close   func() error
}

// Transport is one column of the benchmark matrix.
type Transport struct {
	// Name is the flag value, e.g. "raw-unix".
	Name string
	// Network is "unix" or "tcp"; it decides the listen address.
	Network string
	// Over, when set, is what the report pairs ratios on instead of Network
	// ("tls": rpc-tls is compared with grpc-tls and raw-tls, not the tcp rows).
	Over string
	// Family groups transports for ratios: "rpc", "grpc", "raw", "ndjson".
	Family string
	// PerRequest says in words what one request does on the wire (for docs and --help).
	PerRequest string
	// Serve serves ln in the server process until ctx ends.
	Serve func(ctx context.Context, ln net.Listener) error
	// Dial opens the client side for conc concurrent callers. address is what
	// net.Dial takes for Network (a path or host:port).
	Dial func(ctx context.Context, network, address string, conc int) (*Client, error)
}

var (
	regMu      sync.Mutex
	transports = map[string]*Transport{}
)

// Register adds a transport. It panics on a duplicate name (a programming error).
func Register(t *Transport) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := transports[t.Name]; dup {
		panic("bench: duplicate transport " + t.Name)
	}
	transports[t.Name] = t
}

// DefaultTransports is the matrix's default column order. Transports that are
// not registered in this build are skipped by Transports.
var DefaultTransports = []string{
	"rpc-unix", "rpc-tcp", "grpc-unix", "grpc-tcp", "raw-unix", "raw-tcp", "ndjson-unix",
}

// Lookup returns the registered transport called name.
func Lookup(name string) (*Transport, bool) {
	regMu.Lock()
	defer regMu.Unlock()
	t, ok := transports[name]
	return t, ok
}

// Available lists registered transport names, default order first.
func Available() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, n := range DefaultTransports {
		if _, ok := transports[n]; ok {
			out = append(out, n)
			seen[n] = true
		}
	}
	var rest []string
	for n := range transports {
		if !seen[n] {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// UnknownTransportError reports a transport name that is not registered.
type UnknownTransportError struct{ Name string }

func (e *UnknownTransportError) Error() string {
	return fmt.Sprintf("unknown transport %q (available: %s)", e.Name, strings.Join(Available(), ", "))
}

// ResolveTransports maps names to transports, rejecting unknown and duplicate names.
func ResolveTransports(names []string) ([]*Transport, error) {
	var out []*Transport
	seen := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		t, ok := Lookup(n)
		if !ok {
			return nil, &UnknownTransportError{Name: n}
		}
		if seen[n] {
			return nil, fmt.Errorf("transport %q listed twice", n)
		}
		seen[n] = true
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no transports selected (available: %s)", strings.Join(Available(), ", "))
	}
	return out, nil
}

// dialConns opens conc connections and makes a Caller for each with mk.
func dialConns(ctx context.Context, network, address string, conc int, mk func(net.Conn) Caller) (*Client, error) {
	var d net.Dialer
	conns := make([]net.Conn, 0, conc)
	closeAll := func() error {
		var first error
		for _, c := range conns {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	cl := &Client{Close: closeAll}
	for i := 0; i < conc; i++ {
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("dial %s %s: %w", network, address, err)
		}
		conns = append(conns, c)
		cl.Callers = append(cl.Callers, mk(c))
	}
	return cl, nil
}

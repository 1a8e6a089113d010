package uds

import (
	"context"
	"net"
	"time"
)

// DialOptions configures Dial. The zero value dials once.
type DialOptions struct {
	// Wait retries until the server accepts or ctx ends (the sidecar start-up race).
	Wait bool
	// MinBackoff and MaxBackoff bound the jittered exponential retry delay.
	// Defaults 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
}

// Dial connects to address (see ParseAddr). Errors are *DialError where the
// cause is known.
func Dial(ctx context.Context, address string, opts DialOptions) (net.Conn, error) {
	a, err := ParseAddr(address)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, a.Network(), a.SockaddrName())
}

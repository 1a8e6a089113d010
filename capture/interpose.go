package capture

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// InterposeOptions configures Interpose. The zero value relays and records
// until its context ends, with safe defaults.
type InterposeOptions struct {
	// Sink records the connections. Required.
	Sink Sink
	// Count stops the capture after this many connections have ended
	// (0: no limit). The socket is restored at once; connections still open
	// drain as after a signal. (udskit capture --count counts recorded
	// messages instead, the same in every mode: record.Limit around Sink,
	// ending the capture's ctx.)
	Count int
	// Drain is how long connections still open after the socket was
	// restored may go on (they are relayed and recorded) before they are
	// cut. Default 10s.
	Drain time.Duration
	// Grace is how long the relay socket keeps accepting after the original
	// was renamed back, for clients that looked up the path just before.
	// Default 250ms.
	Grace time.Duration
	// DialTimeout bounds each connect to the real server. Default 10s.
	DialTimeout time.Duration
	// AnyClient relays clients whose uid differs from this process's even
	// when the relay cannot connect to the server with the client's own
	// credentials (it can as root). Without it such clients are refused,
	// because the server would see this process's uid instead of theirs.
	AnyClient bool
	// Logger gets lifecycle notes and one line per refused connection.
	// Default slog.Default().
	Logger *slog.Logger
}

// Stats are an Interposer's counters.
type Stats struct {
	Accepted int64 // connections accepted on the relay socket
	Active   int64 // being relayed now
	Ended    int64 // relayed and finished
	Failed   int64 // the connect to the real server failed
	Refused  int64 // refused: the relay could not act as the client (see AnyClient)
}

// RefusedError says why a socket cannot be interposed; Hint says what to do.
type RefusedError struct {
	Path   string
	Reason string
	Hint   string
	Err    error
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("cannot capture %s: %s", e.Path, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func (e *RefusedError) Unwrap() error { return e.Err }

// ErrCaptureRunning is wrapped when another live capture holds the path.
var ErrCaptureRunning = errors.New("another capture is running on this socket")

// Leftover names beside the socket: PATH + these suffixes.
const (
	// AsideSuffix names the server's original socket while it is aside.
	AsideSuffix = ".udskit-orig"
	// TempSuffix names the relay socket between bind and rename.
	TempSuffix = ".udskit-new"
	// StateSuffix names the state file: who interposed and which inodes.
	StateSuffix = ".udskit-capture"
)

func (o *InterposeOptions) defaults() {
	if o.Drain <= 0 {
		o.Drain = 10 * time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 250 * time.Millisecond
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

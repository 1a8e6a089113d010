package httpcred

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/uds"
)

// Options configures New. The zero value admits any peer with kernel
// credentials (the socket's mode says who can connect at all; uds.Listen
// makes it owner-only by default) and refuses TCP peers, which have none.
type Options struct {
	// Policy decides which peers may make requests. nil: any peer with
	// kernel credentials.
	Policy uds.Policy
	// AllowNoCred lets peers without kernel credentials (TCP) through, with
	// FromRequest reporting ok false; by default they are refused.
	AllowNoCred bool
	// Logger receives refusals at Warn level, at most one line a second.
	// Default slog.Default().
	Logger *slog.Logger
}

// Guard holds the options; its ConnContext and Handler go on an
// http.Server.
type Guard struct {
	opts    Options
	refused atomic.Uint64
	logMu   sync.Mutex
	logLast time.Time
	logSkip uint64
}

// New returns a Guard.
func New(opts Options) *Guard {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Guard{opts: opts}
}

// connInfo is what ConnContext learned about a connection.
type connInfo struct {
	cred    uds.Cred
	hasCred bool
	refusal error // nil: allowed
}

type infoKey struct{}

// ConnContext is for http.Server.ConnContext: it reads c's peer
// credentials and runs the policy, once per connection.
func (g *Guard) ConnContext(ctx context.Context, c net.Conn) context.Context {
	ci := &connInfo{}
	ci.cred, ci.hasCred = uds.CredOf(c)
	switch {
	case !ci.hasCred && !g.opts.AllowNoCred:
		ci.refusal = fmt.Errorf("%w: %w", uds.ErrPeerRefused, uds.ErrNoCred)
	case ci.hasCred && g.opts.Policy != nil:
		ci.refusal = g.opts.Policy(ci.cred)
	}
	if ci.refusal != nil {
		g.refused.Add(1)
		if ok, n := g.allowLog(); ok {
			g.opts.Logger.Warn("httpcred: peer refused by policy", "pid", ci.cred.PID, "uid", ci.cred.UID, "gid", ci.cred.GID,
				"reason", ci.refusal.Error(), "suppressed", n)
		}
	}
	return context.WithValue(ctx, infoKey{}, ci)
}

// Handler wraps next: a request on a connection the policy refused (or one
// that ConnContext did not see: a misconfigured server) gets 403 Forbidden
// and the connection is closed; others go to next.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ci, _ := r.Context().Value(infoKey{}).(*connInfo)
		if ci == nil || ci.refusal != nil {
			w.Header().Set("Connection", "close")
			msg := "forbidden: the peer is refused by the server's policy (its log says why)\n"
			if ci == nil {
				msg = "forbidden: server misconfigured: http.Server.ConnContext is not httpcred's\n"
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Refused returns how many connections the policy refused.
func (g *Guard) Refused() uint64 { return g.refused.Load() }

// FromContext returns the peer's credentials from a request's context.
// ok is false without credentials (TCP with AllowNoCred, or no ConnContext).
func FromContext(ctx context.Context) (uds.Cred, bool) {
	ci, _ := ctx.Value(infoKey{}).(*connInfo)
	if ci == nil {
		return uds.Cred{}, false
	}
	return ci.cred, ci.hasCred
}

// FromRequest is FromContext(r.Context()).
func FromRequest(r *http.Request) (uds.Cred, bool) { return FromContext(r.Context()) }

func (g *Guard) allowLog() (bool, uint64) {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	now := time.Now()
	if !g.logLast.IsZero() && now.Sub(g.logLast) < time.Second {
		g.logSkip++
		return false, 0
	}
	n := g.logSkip
	g.logLast, g.logSkip = now, 0
	return true, n
}

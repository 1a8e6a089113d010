package capture

import (
	"net"
	"time"

	"github.com/udskit/udskit/proxy"
	"github.com/udskit/udskit/uds"
)

// ProxyTap returns a proxy.Tap that records every proxied connection into
// sink, on an interface named by the route's listen address.
func ProxyTap(sink Sink) proxy.Tap { return proxyTap{sink} }

type proxyTap struct{ sink Sink }

func (pt proxyTap) Tap(client, upstream net.Conn, r proxy.Route) (net.Conn, net.Conn, func(proxy.JoinResult)) {
	name := r.Listen
	if a, err := uds.ParseAddr(r.Listen); err == nil && a.Kind == uds.Unix {
		name = a.Name
	}
	rec := pt.sink.Open(ConnInfo{Socket: name, Client: PeerOf(client), Server: PeerOf(upstream), Start: time.Now(),
		Note: "udskit proxy " + r.Listen + " -> " + r.To})
	c, u, pair := wrapRelay(client, upstream, rec)
	return c, u, func(res proxy.JoinResult) { pair.finish(res.Err) }
}

// Package proxy bridges stream sockets: unix <-> tcp, tcp <-> unix, unix <->
// unix, tcp <-> tcp and Linux abstract names, in any combination.
//
// The listen side uses uds.Listen (owner-only socket by default, safe stale
// cleanup, optional peer Policy); the dial side uses uds.Dial (optionally
// waiting for the upstream to appear). On Linux, bytes move with splice(2)
// through a pooled pipe per direction, so payload never passes through user
// space and the Go netpoller handles readiness (no thread blocks in a syscall);
// elsewhere, and for conns that are not plain sockets, a buffered copy is used.
//
// Half-close is forwarded: EOF from one side becomes shutdown(SHUT_WR) on the
// other while the opposite direction keeps flowing, and everything read before
// the EOF is delivered first. When a direction fails, the other direction gets
// a short linger to deliver what is already buffered, then both ends close.
//
// Join is the core, usable on any pair of conns:
//
//	up, _ := uds.Dial(ctx, "tcp:127.0.0.1:5432", uds.DialOptions{})
//	res := proxy.Join(ctx, client, up, proxy.JoinOptions{IdleTimeout: time.Minute})
//	fmt.Println(res.AtoB, res.BtoA, res.Err)
//
// Proxy adds listeners, connection limits, idle timeouts, per-connection
// structured logs and a graceful drain:
//
//	p, err := proxy.Listen(ctx, []proxy.Route{{Listen: "127.0.0.1:5433", To: "/run/postgresql/.s.PGSQL.5432"}}, proxy.Options{})
//	go p.Serve()
//	...
//	p.Shutdown(drainCtx) // stop accepting, let connections finish
package proxy

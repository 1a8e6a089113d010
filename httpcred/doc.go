// Package httpcred gives net/http handlers the kernel credentials (uid, gid,
// pid) of the process at the other end of a unix socket, and runs udskit's
// peer policies (uds.Policy) on them, for an http.Server on uds.Listen:
//
//	g := httpcred.New(httpcred.Options{Policy: uds.AllowUIDs(0, 1000)})
//	srv := &http.Server{Handler: g.Handler(mux), ConnContext: g.ConnContext}
//	l, _ := uds.Listen(ctx, "unix:/run/app/http.sock", uds.ListenOptions{Mode: 0o666})
//	go srv.Serve(l)
//
//	// in a handler:
//	cred, ok := httpcred.FromRequest(r)
//
// ConnContext reads the credentials once per connection (from the *uds.Conn
// uds.Listen returns, or SO_PEERCRED on any unix socket) and runs the policy
// once; Handler answers every request of a refused connection with
// 403 Forbidden and closes it, so no handler of yours runs for it. To refuse
// before a single byte is read instead, give uds.Listen the policy too
// (ListenOptions.Policy): the listener then closes refused peers at accept.
// Test it with `curl --unix-socket /run/app/http.sock http://localhost/`.
package httpcred

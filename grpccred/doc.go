// Package grpccred is gRPC transport credentials for unix sockets: the
// caller's kernel credentials (uid, gid, pid from SO_PEERCRED /
// LOCAL_PEERCRED) checked against a udskit policy (uds.Policy: AllowUIDs,
// AllowGIDs, AnyOf, ...) at the handshake, before gRPC reads a single byte
// of the connection, so a refused client never reaches an RPC handler.
// Handlers read the caller's credentials from the peer:
//
//	creds := grpccred.NewServer(grpccred.ServerOptions{Policy: uds.AllowUIDs(0, 1000)})
//	srv := grpc.NewServer(grpc.Creds(creds))
//	l, _ := uds.Listen(ctx, "unix:/run/app/grpc.sock", uds.ListenOptions{Mode: 0o666})
//	go srv.Serve(l)
//
//	// in a handler:
//	cred, ok := grpccred.FromContext(ctx) // or peer.FromContext(ctx).AuthInfo.(grpccred.AuthInfo)
//
// It combines with uds.Listen (owner-only socket by default, stale-socket
// cleanup, its own accept-time Policy): a connection that uds.Listen
// accepted carries the credentials it read, and this package checks its own
// policy on them. A client uses NewClient, which reports the server
// process's credentials the same way and may check them too (ClientOptions.Policy,
// e.g. only a server running as root). Over TCP there are no kernel
// credentials: the handshake fails on both sides.
//
// The package imports grpc-go; udskit's core packages do not import it.
package grpccred

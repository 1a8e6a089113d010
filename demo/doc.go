// Package demo is the ready-made rpc service behind `udskit serve`, for trying
// udskit out and for embedding in tests and examples:
//
//	echo    returns the request bytes unchanged (any payload; JSON stays JSON)
//	sleep   {"ms":N} waits N ms (or until the caller gives up), returns {"slept_ms":N}
//	fail    {"code":"not_found","message":"..."} always fails with that code and message
//	        (default code failed_precondition)
//	stream  {"n":N,"interval_ms":M} streams N items {"i":0,"n":N} ... M ms apart
//	whoami  returns the caller's {"pid","uid","gid"} as the kernel reports them
//	        (SO_PEERCRED; fails with failed_precondition over TCP)
//	sum     bidirectional: each request item is a JSON number, each answer the
//	        running total; the call ends after the client's last item
//	total   client-streaming: JSON numbers in, their sum out once at the end
//
// Register adds the methods to any *rpc.Server. Server wraps the whole thing
// (listen with socket hygiene, connection limit, connect/disconnect logs with
// peer credentials, graceful drain) for `udskit serve`. Newline-JSON clients
// reach the same methods on the same socket (unary methods only: sum and total
// answer them with unimplemented).
package demo

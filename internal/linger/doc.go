// Package linger is the wait of a linger drain (service.DrainLinger), shared
// by rpc.Server.Linger and proxy.Proxy.Linger: serve on until no client
// connection has been open for Quiet, and at least a minimum grace has
// passed.
//
// Quiet is there because an app in its own shutdown may close a connection
// and open another (a pool recycling, a reconnect after an error): a drain
// that ended the moment the count touched zero would stop accepting just as
// that new connection arrives, and the app's next call would fail. 250 ms
// covers an immediate reconnect and keeps the exit well within a second of
// the app's last connection closing.
//
// It imports nothing of this module.
package linger

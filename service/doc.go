// Package service runs a long-lived server the way `udskit serve` and
// `udskit proxy` run: it listens (or takes the listening sockets over from
// the instance running now), serves, tells systemd, and stops by one set of
// rules. A Go program writing its own sidecar gets the same behaviour with
// one call to Run.
//
//   - Signals: SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed) and
//     SIGPIPE (a write to a closed stdout or stderr pipe; not one to a
//     client's socket, see filterSignals) all start a drain. They are caught
//     from the moment Run is called, so a signal that arrives while the
//     service is still starting aborts the start cleanly instead of killing
//     the process with a socket file left behind. Cancelling Run's context,
//     closing Options.Stop, or a successor taking the sockets over
//     (Options.Control) count as the first signal.
//   - Drain, mode DrainGoaway (the zero value): the service stops accepting
//     at once (its listen socket goes away), tells udskit clients to go away,
//     and open connections or in-flight calls may finish for up to
//     DrainTimeout. At the timeout whatever is still open is closed. Use it
//     for a handoff or an upgrade: a successor is already accepting.
//   - Drain, mode DrainLinger: the service keeps serving as before (it keeps
//     accepting and sends no goaway, since a client in its own shutdown may
//     still call and reconnect) and stops once no client connection remains
//     and at least MinGrace has passed since the signal, or at DrainTimeout,
//     whichever comes first. Use it for a sidecar in a pod: Kubernetes
//     sends SIGTERM to the app and the sidecar at the same moment, and the
//     app still needs the sidecar for its last calls. The service must
//     implement Lingerer (rpc.Server, demo.Server and proxy.Proxy do). Its
//     health method reports "draining" from the signal on, in both modes. A
//     drain started by a successor's takeover is always a goaway drain: the
//     successor accepts on the same sockets, and clients should move to it.
//   - Second signal: any second one of them during the drain closes
//     everything at once.
//   - Drain timeout: DefaultDrainTimeout (5 s) unless Options.DrainTimeout
//     says otherwise. 5 s finishes before `docker stop` (10 s) and a
//     Kubernetes pod (30 s) escalate to SIGKILL.
//   - Exit: a drain is a normal stop, whether it ended cleanly, at the
//     timeout or by a second signal: Run returns a nil error. Run returns an
//     error only when the service failed to start or to serve.
//   - systemd: with $NOTIFY_SOCKET set, READY=1 once serving on
//     Options.Listen (MAINPID= after a takeover), STOPPING=1 when the drain
//     starts (Options.Notify replaces the sender).
//   - Handoff: with Options.Listen, Run gets the listeners from package
//     handoff: bound fresh, or taken over from the running instance
//     (Options.Takeover), and offers them to a successor on the control
//     socket (Options.Control, by default the first unix listen path +
//     ".handoff"). When a successor commits, this instance drains.
//
// Every stop is logged: one line when the drain starts (signal, mode,
// timeout), one when it ends (clean, timed out, or cut short), with the
// service's own counters from Options.Status on both.
//
// Imports: handoff, sdnotify and uds (below it); nothing of rpc, proxy or
// capture, which it runs through the Service interface.
package service

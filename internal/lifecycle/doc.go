// Package lifecycle runs a long-lived service (udskit serve, proxy, and any
// later long-running command) under one set of signal and drain rules, so
// every command stops the same way:
//
//   - Signals: SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed) and
//     SIGPIPE (a write to a closed stdout or stderr pipe; not one to a
//     client's socket, see filterSignals) all start a graceful drain. They
//     are caught from the moment Run is called, so a signal that arrives while
//     the service is still starting aborts the start cleanly instead of
//     killing the process with a socket file left behind. Cancelling Run's
//     context counts as the first signal.
//   - Drain: the service stops accepting at once (its listen socket goes
//     away) and open connections or in-flight calls may finish for up to the
//     drain timeout. At the timeout whatever is still open is closed.
//   - Second signal: any second one of them during the drain closes
//     everything at once.
//   - Drain timeout: DefaultDrainTimeout (5 s) unless Options.DrainTimeout
//     says otherwise. 5 s finishes before `docker stop` (10 s) and a
//     Kubernetes pod (30 s) escalate to SIGKILL. The CLI flag for it is
//     always --drain-timeout and it always means this one thing.
//   - Exit: a drain is a normal stop, whether it ended cleanly, at the
//     timeout or by a second signal: Run returns nil and the command exits 0.
//     Run returns an error only when the service failed to start or to serve.
//
// Every stop is logged: one line when the drain starts (signal, timeout),
// one when it ends (clean, timed out, or cut short), with the service's own
// counters from Options.Status on both.
package lifecycle

package service

import (
	"os"
	"syscall"
)

// filterSignals forwards the signals that stop the service from raw to
// stops until quit is closed, dropping (like signal.Notify) what does not
// fit in stops.
//
// SIGPIPE stops the service only when stdout or stderr lost its reader
// (broken). Once SIGPIPE is caught with signal.Notify, Go delivers it for a
// write to ANY file descriptor whose peer is gone, and a server writes to
// such sockets all the time: a client that closes its connection while a
// reply or a goaway is on its way. That write already fails with EPIPE and
// costs the server that one connection; taken as a signal it started a
// drain of the whole server, or, during a drain (a handoff), cut it short
// and reset every connection with requests still unread (calls lost in
// TestHandoffChainUnderLoad).
func filterSignals(raw <-chan os.Signal, stops chan<- os.Signal, quit <-chan struct{}, broken func() bool) {
	for {
		select {
		case s := <-raw:
			if s == syscall.SIGPIPE && !broken() {
				continue
			}
			select {
			case stops <- s:
			default:
			}
		case <-quit:
			return
		}
	}
}

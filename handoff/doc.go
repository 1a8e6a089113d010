// Package handoff gives a process's listening sockets to another process —
// any program, not only a re-exec of the same binary — with no connection
// refused: the kernel socket, its backlog and its file stay the same (same
// inode, nothing unlinked or re-bound); only the process accepting on it
// changes.
//
// The running process offers its listeners on a control socket beside the
// service (Offer; owner-only, peers checked with kernel credentials, same
// user by default). A new process acquires them (Acquire: named listeners
// plus an optional opaque state blob, over a small versioned handshake
// specified in docs/handoff.md), serves on them, and commits. Only then does
// the old process stop accepting; it drains its in-flight work with a
// deadline and exits. Until the commit the old process serves as if nothing
// happened: an Abort, a commit timeout, or the new process dying leaves it
// exactly as it was. Of two concurrent acquirers exactly one gets the offer;
// the other gets ErrBusy.
//
// The handshake, as a state machine (old = offerer, new = acquirer):
//
//	old: offering --accept--> session: recv HELLO --> send OFFER+fds --> wait
//	       ^                                                             |
//	       +---- ABORT | EOF (new died) | CommitTimeout | bad message <--+
//	                                                                     |
//	     COMMIT --> release listeners (Accept parks, file not ours)      |
//	            --> close control socket --> send COMMITTED --> Committed()
//
//	new: Acquire (HELLO, OFFER) --> Listener(name) --> serve (Accept)
//	       --> Commit: COMMIT --> COMMITTED --> owns listeners and files
//	       \-> Abort: ABORT, taken listeners closed (files stay)
//
// Ownership of the socket file follows the serving process: a released
// listener's Close leaves the file; a taken one removes it only once its
// process has committed (uds.Listener.Own); neither ever removes a file that
// is not the socket it served.
//
// With systemd (Type=notify), the old process names its successor at the
// commit (MAINPID=, package sdnotify) so the service follows it, and the
// reload command returns once the successor has committed (RunDetached):
//
//	[Service]
//	Type=notify
//	NotifyAccess=all
//	ExecStart=/usr/local/bin/udskit serve /run/app/app.sock
//	ExecReload=/usr/local/bin/udskit serve /run/app/app.sock --handoff --detach
//
// docs/handoff.md has the full unit, the wire format and measurements.
package handoff

// Package sdnotify tells systemd about a service's state (sd_notify(3)):
// READY=1 once serving, STOPPING=1 when draining, STATUS= for humans,
// MAINPID= when a handoff moves the service to another process, and
// FDSTORE=1 to park descriptors in systemd across a restart.
//
// Messages go as datagrams to $NOTIFY_SOCKET (a path or an @abstract name).
// Without it (not under systemd, or Type= is not notify) every call is a
// no-op that returns nil, so callers need no special case. The variable is
// left in the environment: a successor started for a handoff must be able to
// notify too (with NotifyAccess=all in the unit).
package sdnotify

// Package socklist is an inventory of the unix domain sockets on this host (in
// this network namespace): what `udskit ls` prints and what `udskit doctor`
// uses to tell a live socket from a stale one.
//
// Sources, joined by socket inode:
//
//   - NETLINK_SOCK_DIAG (unix_diag), the same interface `ss -x` uses: type,
//     state, bound name, the inode of the bound file (UNIX_DIAG_VFS), the peer's
//     socket inode (UNIX_DIAG_PEER), the accept queue of listeners
//     (UNIX_DIAG_ICONS, UNIX_DIAG_RQLEN: for a listener rqueue is the number of
//     connections waiting in accept() and wqueue the listen backlog), and the
//     socket owner's uid (UNIX_DIAG_UID). It works unprivileged.
//   - /proc/net/unix, used when sock_diag is unavailable (no peer or queue data then).
//   - /proc/PID/fd: every "socket:[INODE]" link names a process holding that
//     socket. Other users' fd tables are unreadable without privilege; such
//     processes are counted in Snapshot.Unreadable and their sockets show no owner.
//
// Connected clients of a listener: when a client connects, the kernel creates
// the server-side end of the connection and copies the listener's bound
// address and bound file (the same VFS inode) onto it. Until accept() that end
// sits in the listener's queue and is not listed anywhere (its count is the
// listener's rqueue). After accept() it is an ordinary connected socket. So
//
//	clients = accepted + pending
//	accepted = connected stream/seqpacket sockets sharing the listener's bound
//	           file inode and device (abstract: its name), listener excluded
//	pending  = the listener's rqueue (connections waiting in accept())
//
// and the client processes are the owners of each accepted end's peer socket.
// Without sock_diag the join falls back to the path string and pending is unknown.
//
// Pids are observations at the time of the snapshot: a pid can exit and be
// reused, so never authorize on them.
package socklist

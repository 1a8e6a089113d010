package uds

import "syscall"

// reservedFDs is what DefaultMaxConns leaves of the fd limit for everything
// else a server opens (listeners, logs, outbound dials, files).
const reservedFDs = 64

// DefaultMaxConns is a connection limit that protects the process's fd
// limit: the soft RLIMIT_NOFILE (which Go raises to the hard limit at
// start-up) minus a reserve of 64 fds, and at least 16. A server at this
// limit keeps the fds it needs to go on working; without a limit, a flood of
// connections makes every accept, dial and open fail with EMFILE.
func DefaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return maxConnsFor(1024)
	}
	return maxConnsFor(uint64(rl.Cur))
}

// maxConnsFor is DefaultMaxConns for an fd limit of n.
func maxConnsFor(n uint64) int {
	n = min(n, 1<<30)
	return max(int(n)-reservedFDs, 16)
}

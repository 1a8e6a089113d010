package kcapture

import (
	"context"
	"sync"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/socklist"
)

// procResolver answers Resolver queries from socklist snapshots (sock_diag
// and /proc/PID/fd), refreshed when an inode is unknown, at most every
// refreshEvery. Safe for concurrent use.
type procResolver struct {
	mu   sync.Mutex
	snap *socklist.Snapshot
	at   time.Time
}

// refreshEvery bounds how often a snapshot (a scan of every /proc/PID/fd)
// is taken: the reader waits for it.
const refreshEvery = time.Second

// NewResolver returns a Resolver that looks inodes up in /proc and sock_diag.
func NewResolver() Resolver {
	r := &procResolver{}
	return r.resolve
}

// boundPath names the socket file with this inode and device (kernel
// encoding), from the listener still bound to it.
func (r *procResolver) boundPath(ino uint64, dev uint32) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for try := 0; try < 2; try++ {
		if r.snap != nil {
			if socks := r.snap.ListenersOnFile(ino, dev>>20, dev&0xfffff); len(socks) > 0 {
				return socks[0].Path
			}
		}
		if try == 0 && !r.refresh() {
			break
		}
	}
	return ""
}

// refresh takes a new snapshot unless the last is younger than
// refreshEvery; it reports whether it did.
func (r *procResolver) refresh() bool {
	if time.Since(r.at) <= refreshEvery {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	snap, err := socklist.List(ctx, socklist.Options{})
	cancel()
	r.at = time.Now()
	if err == nil {
		r.snap = snap
	}
	return err == nil
}

func (r *procResolver) resolve(inode uint64) ([]Proc, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.lookup(inode)
	if s == nil && r.refresh() {
		s = r.lookup(inode)
	}
	if s == nil {
		return nil, ""
	}
	procs := make([]Proc, 0, len(s.Procs))
	for _, p := range s.Procs {
		uid, gid := procIDs(p.PID)
		procs = append(procs, Proc{PID: p.PID, UID: uid, GID: gid, Command: p.Command})
	}
	return procs, s.Path
}

func (r *procResolver) lookup(inode uint64) *socklist.Socket {
	if r.snap == nil {
		return nil
	}
	return r.snap.ByInode(inode)
}

// procIDs reads the effective uid and gid of pid from /proc (-1 when unknown).
func procIDs(pid int) (uid, gid int) {
	if pid <= 0 {
		return -1, -1
	}
	st, err := proc.ReadStatus(pid)
	if err != nil {
		return -1, -1
	}
	return st.IDs()
}

// procComm reads /proc/PID/comm ("" when gone).
func procComm(pid int) string { return proc.Comm(pid) }

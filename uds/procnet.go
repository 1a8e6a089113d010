package uds

import (
	"io"

	"github.com/udskit/udskit/internal/proc"
)

// listeningInode finds, in the text of Linux's /proc/net/unix, the inode of a
// listening socket bound to one of names.
func listeningInode(r io.Reader, names ...string) (uint64, bool) {
	var ino uint64
	found := false
	proc.ScanNetUnix(r, func(e proc.UnixEntry) bool {
		if !e.Listening() {
			return true
		}
		for _, n := range names {
			if n != "" && e.Path == n {
				ino, found = e.Inode, true
				return false
			}
		}
		return true
	})
	return ino, found
}

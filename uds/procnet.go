package uds

import (
	"bytes"
	"strconv"
)

// maxProcNetUnix caps how much of /proc/net/unix is read.
const maxProcNetUnix = 32 << 20

// listeningInode finds, in the text of Linux's /proc/net/unix, the inode of a
// listening socket bound to one of names. The format is one header line, then
//
//	Num RefCount Protocol Flags Type St Inode Path
//
// with Flags 00010000 (__SO_ACCEPTCON) for a listening socket. The path is the
// rest of the line (it may contain spaces). Malformed lines are skipped.
func listeningInode(data []byte, names ...string) (uint64, bool) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		var f [7][]byte
		rest := line
		ok := true
		for i := range f {
			rest = bytes.TrimLeft(rest, " ")
			j := bytes.IndexByte(rest, ' ')
			if j < 0 {
				ok = false
				break
			}
			f[i], rest = rest[:j], rest[j+1:]
		}
		if !ok {
			continue
		}
		path := string(bytes.TrimLeft(rest, " "))
		flags, err := strconv.ParseUint(string(f[3]), 16, 32)
		if err != nil || flags&0x10000 == 0 {
			continue
		}
		ino, err := strconv.ParseUint(string(f[6]), 10, 64)
		if err != nil {
			continue
		}
		for _, n := range names {
			if n != "" && path == n {
				return ino, true
			}
		}
	}
	return 0, false
}

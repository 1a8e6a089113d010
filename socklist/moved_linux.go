package socklist

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxDirEntries bounds how many names resolveMoved reads from one directory.
const maxDirEntries = 4096

// resolveMoved gives listeners that were moved after bind(2) their public
// path. A server may bind under a private name and then link(2) or rename(2)
// the socket file to its public path (udskit's Node package does: a 0700
// directory next to the target, so the socket is never reachable with the
// umask's bits). The kernel keeps the name it bound, a path that no longer
// exists; sock_diag still gives the inode of the file. So for a listener
// whose bound name is gone, look for a socket file with that inode and device
// in the bound name's directory and the one above it (where such private
// directories are made), read at most maxDirEntries names each. The found
// path becomes Path and the kernel's name BoundPath; accepted ends that
// carry the listener's name follow it. Nothing is opened but directories, and
// nothing is followed: entries are Lstat'ed.
func resolveMoved(socks []Socket) {
	moved := map[string]string{}
	for i := range socks {
		s := &socks[i]
		if !s.Listening() || s.VFSIno == 0 || !strings.HasPrefix(s.Path, "/") {
			continue
		}
		if _, seen := moved[s.Path]; seen {
			continue
		}
		if _, err := os.Lstat(s.Path); !errors.Is(err, fs.ErrNotExist) {
			moved[s.Path] = ""
			continue
		}
		moved[s.Path] = findSocketFile(s.Path, s.VFSIno, s.VFSDev)
	}
	for i := range socks {
		if p := moved[socks[i].Path]; p != "" {
			socks[i].BoundPath, socks[i].Path = socks[i].Path, p
		}
	}
}

// findSocketFile returns a socket file with inode ino on device dev (kernel
// encoding, major<<20 | minor) in the directory of bound or its parent, or "".
func findSocketFile(bound string, ino, dev uint32) string {
	dir := filepath.Dir(bound)
	for _, d := range []string{dir, filepath.Dir(dir)} {
		f, err := os.Open(d)
		if err != nil {
			continue
		}
		ents, _ := f.ReadDir(maxDirEntries)
		f.Close()
		for _, e := range ents {
			if e.Type()&fs.ModeSocket == 0 {
				continue
			}
			p := filepath.Join(d, e.Name())
			fi, err := os.Lstat(p)
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if ok && st.Ino == uint64(ino) && unix.Major(st.Dev) == dev>>20 && unix.Minor(st.Dev) == dev&0xfffff {
				return p
			}
		}
		if d == "/" {
			break
		}
	}
	return ""
}

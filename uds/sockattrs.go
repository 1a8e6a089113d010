package uds

import "os"

// SetSocketAttrs gives the socket file at path, which the caller has just
// bound, the permission bits mode and the owner uid/gid (-1 leaves one as it
// is), without ever following a symlink: a user who can write in the
// directory cannot make it chmod or chown another file by swapping one in
// after bind. It refuses a path that is no longer a socket owned by this
// process's euid. Listen does this for its own sockets; programs that bind
// sockets themselves (an interposer, a relay) use it too. The returned info
// is the file's after the change (or before it, on a failed change).
func SetSocketAttrs(path string, mode os.FileMode, uid, gid int) (os.FileInfo, error) {
	return setSocketFileAttrs(path, uint32(mode.Perm()), uid, gid)
}

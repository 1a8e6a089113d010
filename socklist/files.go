package socklist

import (
	"io/fs"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// StatFiles fills Mode and Owner of each socket bound to a path from the
// socket file there (who may connect: its mode, owner and group), looking
// each path and each id up once.
func StatFiles(socks []Socket) {
	type attrs struct{ mode, owner string }
	seen := map[string]attrs{}
	users, groups := map[uint32]string{}, map[uint32]string{}
	for i := range socks {
		s := &socks[i]
		if !strings.HasPrefix(s.Path, "/") {
			continue
		}
		a, ok := seen[s.Path]
		if !ok {
			if fi, err := os.Lstat(s.Path); err == nil && fi.Mode().Type() == fs.ModeSocket {
				a.mode = "s" + fi.Mode().Perm().String()[1:] // as ls -l shows it
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					a.owner = idName(users, st.Uid, true) + ":" + idName(groups, st.Gid, false)
				}
			}
			seen[s.Path] = a
		}
		s.Mode, s.Owner = a.mode, a.owner
	}
}

// idName is the user (or group) name of id, else the number, cached.
func idName(cache map[uint32]string, id uint32, isUser bool) string {
	if n, ok := cache[id]; ok {
		return n
	}
	n := strconv.FormatUint(uint64(id), 10)
	if isUser {
		if u, err := user.LookupId(n); err == nil {
			n = u.Username
		}
	} else if g, err := user.LookupGroupId(n); err == nil {
		n = g.Name
	}
	cache[id] = n
	return n
}

package uds

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
)

// UserID resolves a user name or a decimal uid (as chown(1) does: a number
// is taken as an id without a lookup).
func UserID(s string) (uint32, error) { return lookupID(s, false) }

// GroupID resolves a group name or a decimal gid.
func GroupID(s string) (uint32, error) { return lookupID(s, true) }

func lookupID(s string, group bool) (uint32, error) {
	s = strings.TrimSpace(s)
	what := "user"
	if group {
		what = "group"
	}
	if s == "" {
		return 0, fmt.Errorf("empty %s name", what)
	}
	if n, err := strconv.ParseUint(s, 10, 31); err == nil {
		return uint32(n), nil
	}
	id := ""
	if group {
		if g, err := user.LookupGroup(s); err == nil {
			id = g.Gid
		}
	} else if u, err := user.Lookup(s); err == nil {
		id = u.Uid
	}
	n, err := strconv.ParseUint(id, 10, 31)
	if err != nil {
		return 0, fmt.Errorf("no %s %q (want a %s name or a number)", what, s, what)
	}
	return uint32(n), nil
}

// UserIDs resolves comma-separated lists of user names or uids, e.g. the
// values of a repeated --allow-uid flag: UserIDs("1000,alice", "bob").
func UserIDs(lists ...string) ([]uint32, error) {
	var out []uint32
	for _, l := range lists {
		for _, s := range strings.Split(l, ",") {
			id, err := UserID(s)
			if err != nil {
				return nil, err
			}
			out = append(out, id)
		}
	}
	return out, nil
}

// ParseOwner reads USER, USER:GROUP or :GROUP (names or numbers) into the
// ListenOptions.UID and GID fields; an absent part stays nil.
func ParseOwner(s string) (uid, gid *int, err error) {
	name, group, _ := strings.Cut(s, ":")
	if name != "" {
		id, err := UserID(name)
		if err != nil {
			return nil, nil, err
		}
		uid = new(int(id))
	}
	if group != "" {
		id, err := GroupID(group)
		if err != nil {
			return nil, nil, err
		}
		gid = new(int(id))
	}
	if uid == nil && gid == nil {
		return nil, nil, errors.New("want USER, USER:GROUP or :GROUP")
	}
	return uid, gid, nil
}

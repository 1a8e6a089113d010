package uds

import (
	"strings"
	"testing"
)

func TestUserAndGroupIDs(t *testing.T) {
	if id, err := UserID("root"); err != nil || id != 0 {
		t.Errorf(`UserID("root") = %d, %v; want 0`, id, err)
	}
	if id, err := GroupID("root"); err != nil || id != 0 {
		t.Errorf(`GroupID("root") = %d, %v; want 0`, id, err)
	}
	if id, err := UserID(" 1234 "); err != nil || id != 1234 {
		t.Errorf(`UserID("1234") = %d, %v`, id, err)
	}
	for _, bad := range []string{"no-such-user-udskit", "", "-1", "99999999999"} {
		if _, err := UserID(bad); err == nil {
			t.Errorf("UserID(%q) accepted", bad)
		}
	}
	if _, err := GroupID("no-such-group-udskit"); err == nil || !strings.Contains(err.Error(), `no group "no-such-group-udskit"`) {
		t.Errorf("unknown group: %v", err)
	}
	ids, err := UserIDs("1000,root", "7")
	if err != nil || len(ids) != 3 || ids[0] != 1000 || ids[1] != 0 || ids[2] != 7 {
		t.Errorf("UserIDs = %v, %v", ids, err)
	}
	if _, err := UserIDs("1000,nobody-udskit-x"); err == nil {
		t.Error("UserIDs accepted an unknown name")
	}
}

func TestParseOwner(t *testing.T) {
	ptr := func(p *int) int {
		if p == nil {
			return -1
		}
		return *p
	}
	for _, tc := range []struct {
		in       string
		uid, gid int
		ok       bool
	}{
		{"root", 0, -1, true},
		{"root:root", 0, 0, true},
		{":5", -1, 5, true},
		{"1000:", 1000, -1, true},
		{":", 0, 0, false},
		{"", 0, 0, false},
		{"root:no-such-group-udskit", 0, 0, false},
	} {
		u, g, err := ParseOwner(tc.in)
		if (err == nil) != tc.ok || (tc.ok && (ptr(u) != tc.uid || ptr(g) != tc.gid)) {
			t.Errorf("ParseOwner(%q) = %d, %d, %v", tc.in, ptr(u), ptr(g), err)
		}
	}
}

package uds

import (
	"strings"
	"testing"
)

const procNetSample = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 4242 /run/a b.sock
0000000000000000: 00000003 00000000 00000000 0001 03 4343 /run/a b.sock
0000000000000000: 00000002 00000000 00010000 0001 01 77 @abstract
0000000000000000: 00000002 00000000 00010000 0001 01 88
garbage
`

func TestListeningInode(t *testing.T) {
	for _, tc := range []struct {
		name string
		ino  uint64
		ok   bool
	}{
		{"/run/a b.sock", 4242, true}, // the listening one, not the connected one
		{"@abstract", 77, true},
		{"/nope", 0, false},
	} {
		ino, ok := listeningInode(strings.NewReader(procNetSample), tc.name)
		if ino != tc.ino || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.name, ino, ok, tc.ino, tc.ok)
		}
	}
}

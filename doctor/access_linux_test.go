package doctor

import (
	"strings"
	"testing"
)

// Recorded statfs magics: shared-folder filesystems are named (a stale-looking
// socket there was most likely made by another kernel); local ones are not.
func TestForeignFSName(t *testing.T) {
	for magic, want := range map[uint32]string{
		0x01021997: "9p",
		0x65735546: "virtiofs",
		0x6969:     "NFS",
		0xfe534d42: "SMB",
		0x786f4256: "VirtualBox",
	} {
		if got := foreignFSName(magic); !strings.Contains(got, want) {
			t.Errorf("magic %#x: %q, want it named %s", magic, got, want)
		}
	}
	for _, local := range []uint32{0xef53 /* ext4 */, 0x01021994 /* tmpfs */, 0x58465342 /* xfs */, 0x9123683e /* btrfs */, 0x794c7630 /* overlay */} {
		if got := foreignFSName(local); got != "" {
			t.Errorf("local magic %#x named foreign: %q", local, got)
		}
	}
}

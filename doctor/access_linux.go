package doctor

import (
	"golang.org/x/sys/unix"
)

const (
	xOK = unix.X_OK
	wOK = unix.W_OK
)

// accessOK checks p against the effective uid/gid and groups, as connect(2) does.
func accessOK(p string, mode uint32) error {
	return unix.Faccessat(unix.AT_FDCWD, p, mode, unix.AT_EACCESS)
}

func major(dev uint64) uint32 { return unix.Major(dev) }
func minor(dev uint64) uint32 { return unix.Minor(dev) }

// foreignFS names the filesystem of p when it is one that shares files from
// another kernel (a VM host or guest); "" otherwise.
func foreignFS(p string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return ""
	}
	return foreignFSName(uint32(st.Type))
}

// foreignFSName names a statfs f_type magic that shares files across
// kernels; "" for local filesystems.
func foreignFSName(magic uint32) string {
	switch magic {
	case 0x01021997:
		return "9p (VM shared folder)"
	case 0x65735546:
		return "FUSE/virtiofs (shared folder: Docker Desktop, Lima, virtiofs)"
	case 0x6969:
		return "NFS"
	case 0xfe534d42, 0xff534d42:
		return "SMB/CIFS"
	case 0x786f4256:
		return "VirtualBox shared folder"
	}
	return ""
}

package proc

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PIDs returns the process ids listed under root (Root when empty).
func PIDs(root string) ([]int, error) {
	if root == "" {
		root = Root
	}
	d, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// Every entry of /proc, not only pids: pid_max is at most 4194304.
	names, err := d.Readdirnames(8 << 20)
	if err != nil && len(names) == 0 {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// SocketInodes returns the inodes of the sockets among the open files of
// pid (the "socket:[N]" links of root/PID/fd, at most MaxFDs read), each
// once, in the order found. The error is the one opening the fd directory:
// os.ErrPermission for another user's process when not privileged,
// os.ErrNotExist for one that exited.
func SocketInodes(root string, pid int) ([]uint64, error) {
	dir := filepath.Join(pidDir(root, pid), "fd")
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	names, _ := d.Readdirnames(MaxFDs)
	d.Close()
	var inos []uint64
	seen := map[uint64]bool{}
	for _, n := range names {
		target, err := os.Readlink(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		if ino, ok := ParseSocketLink(target); ok && !seen[ino] {
			seen[ino] = true
			inos = append(inos, ino)
		}
	}
	return inos, nil
}

// ParseSocketLink parses the target of a /proc/PID/fd link to a socket,
// "socket:[N]".
func ParseSocketLink(target string) (uint64, bool) {
	rest, ok := strings.CutPrefix(target, "socket:[")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(num, 10, 64)
	return ino, err == nil
}

// PIDWithSocket returns the first process under root (Root when empty) that
// holds socket inode ino open, or 0.
func PIDWithSocket(root string, ino uint64) int {
	pids, err := PIDs(root)
	if err != nil {
		return 0
	}
	for _, pid := range pids {
		inos, _ := SocketInodes(root, pid)
		for _, i := range inos {
			if i == ino {
				return pid
			}
		}
	}
	return 0
}

// CountFDs returns how many files pid (0: this process) has open (entries of /proc/PID/fd, at
// most MaxFDs counted).
func CountFDs(pid int) (int, error) {
	d, err := os.Open(filepath.Join(pidDir(Root, pid), "fd"))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(MaxFDs)
	if err != nil && len(names) == 0 && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return len(names), nil
}

package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Root is where the proc filesystem is mounted.
const Root = "/proc"

// Caps on what one read takes.
const (
	// MaxComm bounds /proc/PID/comm (TASK_COMM_LEN is 16); longer is cut.
	MaxComm = 64
	// MaxStatus bounds /proc/PID/status (about 1.5 KiB on Linux 6.x).
	MaxStatus = 64 << 10
	// MaxStat bounds /proc/PID/stat (about 300 bytes, plus the command name).
	MaxStat = 4 << 10
	// MaxFDs bounds the open files listed for one process.
	MaxFDs = 1 << 20
)

// ErrTooLarge says a /proc file was larger than its cap.
var ErrTooLarge = errors.New("proc: file over its size cap")

// readCapped reads at most max bytes of name. With cut, a longer file is cut
// at max; without, it is ErrTooLarge.
func readCapped(name string, max int64, cut bool) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		if !cut {
			return nil, fmt.Errorf("%s: %w (%d bytes)", name, ErrTooLarge, max)
		}
		b = b[:max]
	}
	return b, nil
}

// pidDir is root/PID, or root/self for pid 0.
func pidDir(root string, pid int) string {
	if root == "" {
		root = Root
	}
	if pid == 0 {
		return filepath.Join(root, "self")
	}
	return filepath.Join(root, strconv.Itoa(pid))
}

// Comm returns the command name of pid ("" when it cannot be read: gone,
// or not Linux). Pids are reused: this is an observation, not a proof.
func Comm(pid int) string {
	if pid <= 0 {
		return ""
	}
	s, _ := CommAt(Root, pid)
	return s
}

// CommAt reads root/PID/comm, at most MaxComm bytes, without its newline.
func CommAt(root string, pid int) (string, error) {
	b, err := readCapped(filepath.Join(pidDir(root, pid), "comm"), MaxComm, true)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Alive reports whether a process pid exists (its /proc entry is there).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, err := os.Stat(pidDir(Root, pid))
	return err == nil
}

// MaxSmallFile bounds ReadSmall.
const MaxSmallFile = 1 << 20

// ReadSmall reads a small kernel file (/proc/cpuinfo, /proc/sys/...), at
// most MaxSmallFile bytes (a longer file is cut there), trimmed of space.
func ReadSmall(name string) (string, error) {
	b, err := readCapped(name, MaxSmallFile, true)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

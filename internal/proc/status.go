package proc

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Status is the text of /proc/PID/status, read once, with its fields parsed
// on demand. The zero Status has no fields.
type Status struct{ text string }

// MaxGroups bounds the supplementary groups Groups returns (NGROUPS_MAX is
// 65536; connect-as-client needs the first ones only).
const MaxGroups = 1024

// ReadStatus reads /proc/PID/status (pid 0: this process), at most MaxStatus
// bytes.
func ReadStatus(pid int) (Status, error) { return ReadStatusAt(Root, pid) }

// ReadStatusAt reads root/PID/status.
func ReadStatusAt(root string, pid int) (Status, error) {
	b, err := readCapped(filepath.Join(pidDir(root, pid), "status"), MaxStatus, false)
	if err != nil {
		return Status{}, err
	}
	return ParseStatus(string(b)), nil
}

// ParseStatus wraps the text of a status file.
func ParseStatus(text string) Status { return Status{text: text} }

// Field returns the value of the line "name:\tvalue", trimmed.
func (s Status) Field(name string) (string, bool) {
	for line := range strings.Lines(s.text) {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// KB returns a "Name:  N kB" field, such as VmRSS (resident set now) or
// VmHWM (its peak), in KiB (a plain number, such as Threads, as it is).
func (s Status) KB(name string) (int64, bool) {
	v, ok := s.Field(name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	return n, err == nil
}

// IDs returns the effective uid and gid (the second of the real, effective,
// saved and filesystem ids), -1 when not there.
func (s Status) IDs() (uid, gid int) {
	return s.effective("Uid"), s.effective("Gid")
}

func (s Status) effective(name string) int {
	v, ok := s.Field(name)
	if !ok {
		return -1
	}
	f := strings.Fields(v)
	if len(f) < 2 {
		return -1
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// Groups returns the supplementary groups (at most MaxGroups; none when the
// line is missing).
func (s Status) Groups() []uint32 {
	v, _ := s.Field("Groups")
	var gs []uint32
	for _, g := range strings.Fields(v) {
		if len(gs) >= MaxGroups {
			break
		}
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			gs = append(gs, uint32(n))
		}
	}
	return gs
}

// CapEff returns the effective capability set.
func (s Status) CapEff() (uint64, error) {
	v, ok := s.Field("CapEff")
	if !ok {
		return 0, fmt.Errorf("no CapEff in /proc status")
	}
	return strconv.ParseUint(v, 16, 64)
}

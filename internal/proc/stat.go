package proc

import (
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of the times in /proc/PID/stat (100 on
// every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// Stat is the part of /proc/PID/stat the measuring programs use.
type Stat struct {
	PPID int
	// User and System are the process's CPU time, all its threads.
	User, System time.Duration
	// ChildUser and ChildSystem are the CPU time of the children it has
	// waited for (reaped).
	ChildUser, ChildSystem time.Duration
}

// CPU is User+System.
func (s Stat) CPU() time.Duration { return s.User + s.System }

// ReadStat reads /proc/PID/stat. ok is false when it cannot be read or parsed.
func ReadStat(pid int) (Stat, bool) {
	if pid <= 0 {
		return Stat{}, false
	}
	b, err := readCapped(filepath.Join(pidDir(Root, pid), "stat"), MaxStat, false)
	if err != nil {
		return Stat{}, false
	}
	return parseStat(string(b))
}

// parseStat parses the text of /proc/PID/stat.
func parseStat(s string) (Stat, bool) {
	// The command name is in parentheses and may hold spaces and parentheses:
	// split after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, false
	}
	// After ")": state(3) ppid(4) ... utime(14) stime(15) cutime(16)
	// cstime(17), so field k of stat is f[k-3].
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return Stat{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Stat{}, false
	}
	var t [4]time.Duration
	for j := range t {
		v, err := strconv.ParseInt(f[14+j-3], 10, 64)
		if err != nil {
			return Stat{}, false
		}
		t[j] = time.Duration(v) * clockTick
	}
	return Stat{PPID: ppid, User: t[0], System: t[1], ChildUser: t[2], ChildSystem: t[3]}, true
}

// StatusKB reads one "Name:  N kB" line of /proc/PID/status, such as VmRSS
// (resident set now) or VmHWM (its peak), in KiB. ok is false when the
// file cannot be read or has no such line.
func StatusKB(pid int, name string) (kb int64, ok bool) {
	if pid <= 0 {
		return 0, false
	}
	st, err := ReadStatus(pid)
	if err != nil {
		return 0, false
	}
	return st.KB(name)
}

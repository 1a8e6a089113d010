package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat times (100 on every Linux
// architecture Go supports).
const clockTick = 10 * time.Millisecond

// procCPU returns the CPU time (user+system) of process pid, its threads
// included, plus that of its children it has already reaped (socat's forked
// per-connection children end up there). ok is false when it cannot be read.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may hold spaces: split after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// After ")": state(3) ... utime(14) stime(15) cutime(16) cstime(17), so
	// field k of stat is f[k-3].
	if len(f) < 15 {
		return 0, false
	}
	var sum int64
	for _, k := range []int{14, 15, 16, 17} {
		v, err := strconv.ParseInt(f[k-3], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return time.Duration(sum) * clockTick, true
}

// treeCPU is procCPU of pid plus the CPU time of its live children, so a
// forking proxy (socat) is charged for connections still being served.
func treeCPU(pid int) (time.Duration, bool) {
	total, ok := procCPU(pid)
	if !ok {
		return 0, false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return total, true
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 15 || f[1] != strconv.Itoa(pid) { // f[1] is ppid (field 4)
			continue
		}
		if c, ok := procCPU(child); ok {
			total += c
		}
	}
	return total, true
}

// selfCPU is this process's CPU time (client and server goroutines).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

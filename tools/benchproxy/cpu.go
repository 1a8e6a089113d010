package main

import (
	"time"

	"github.com/udskit/udskit/internal/proc"
)

// procCPU returns the CPU time (user+system) of process pid, its threads
// included, plus that of its children it has already reaped (socat's forked
// per-connection children end up there). ok is false when it cannot be read
// (off Linux: no /proc).
func procCPU(pid int) (time.Duration, bool) {
	s, ok := proc.ReadStat(pid)
	return s.CPU() + s.ChildUser + s.ChildSystem, ok
}

// treeCPU is procCPU of pid plus the CPU time of its live children, so a
// forking proxy (socat) is charged for connections still being served.
func treeCPU(pid int) (time.Duration, bool) {
	total, ok := procCPU(pid)
	if !ok {
		return 0, false
	}
	pids, err := proc.PIDs("")
	if err != nil {
		return total, true
	}
	for _, child := range pids {
		if child == pid {
			continue
		}
		if s, ok := proc.ReadStat(child); ok && s.PPID == pid {
			total += s.CPU() + s.ChildUser + s.ChildSystem
		}
	}
	return total, true
}

// selfCPU is this process's CPU time (client and server goroutines).
func selfCPU() time.Duration {
	u, s := proc.SelfCPU()
	return u + s
}

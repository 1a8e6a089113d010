//go:build unix

package proc

import (
	"syscall"
	"time"
)

// SelfCPU returns this process's user and system CPU time
// (getrusage(RUSAGE_SELF)); zeros when it cannot be read.
func SelfCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

package clocktime

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

type sysClock struct {
	name string
	read func() error
}

// rawClockGettime is a bare clock_gettime system call: no vDSO and none of
// the Go scheduler bookkeeping unix.ClockGettime adds.
func rawClockGettime(id int32) error {
	var ts unix.Timespec
	_, _, e := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, uintptr(id), uintptr(unsafe.Pointer(&ts)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func syscallClocks() []sysClock {
	mk := func(name string, id int32) sysClock {
		return sysClock{name: name, read: func() error { return rawClockGettime(id) }}
	}
	return []sysClock{
		mk("MONOTONIC", unix.CLOCK_MONOTONIC),
		mk("REALTIME", unix.CLOCK_REALTIME),
		mk("MONOTONIC_COARSE", unix.CLOCK_MONOTONIC_COARSE),
		mk("REALTIME_COARSE", unix.CLOCK_REALTIME_COARSE),
		mk("BOOTTIME", unix.CLOCK_BOOTTIME),
	}
}

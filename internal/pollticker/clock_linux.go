package pollticker

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timerfd is a clock on a Linux timerfd, read through the runtime's poller
// (os.File registers a non-blocking descriptor with it), so the hub's wait
// parks its goroutine instead of keeping a runtime timer.
type timerfd struct {
	fd int
	f  *os.File
}

func openClock() (clock, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("pollticker: timerfd_create: %w", err)
	}
	return &timerfd{fd: fd, f: os.NewFile(uintptr(fd), "pollticker-timerfd")}, nil
}

func (c *timerfd) arm(d time.Duration) {
	spec := unix.ItimerSpec{}
	if d > 0 {
		spec.Value = unix.NsecToTimespec(int64(d))
	}
	unix.TimerfdSettime(c.fd, 0, &spec, nil)
}

func (c *timerfd) wait() error {
	var b [8]byte // the number of expirations; the hub reads the time itself
	_, err := c.f.Read(b[:])
	return err
}

package extcap

import (
	"context"
	"os"

	"golang.org/x/sys/unix"
)

// watchReader calls gone when the reader of the fifo f has closed it
// (POLLERR on the write end), checking every quarter second until ctx
// ends. A regular file never reports it.
func watchReader(ctx context.Context, f *os.File, gone func()) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		var revents int16
		cerr := rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd)}}
			if n, err := unix.Poll(pfd, 250); err == nil && n > 0 {
				revents = pfd[0].Revents
			}
		})
		if cerr != nil {
			return
		}
		if revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			gone()
			return
		}
	}
}

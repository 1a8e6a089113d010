//go:build unix

package pcapng

import (
	"os"

	"golang.org/x/sys/unix"
)

// maxIov stays under IOV_MAX (1024 on Linux and the BSDs).
const maxIov = 1024

// writev writes every byte of bufs to f with writev(2), through Go's poller
// when f is non-blocking (a pipe from os.Pipe), looping on short writes.
func writev(f *os.File, bufs [][]byte) (int64, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var total int64
	var werr error
	for len(bufs) > 0 {
		batch := bufs[:min(len(bufs), maxIov)]
		var n int
		err := rc.Write(func(fd uintptr) bool {
			n, werr = unix.Writev(int(fd), batch)
			return werr != unix.EAGAIN
		})
		if err == nil {
			err = werr
		}
		if err == unix.EINTR {
			continue
		}
		if n > 0 {
			total += int64(n)
		}
		if err != nil {
			return total, err
		}
		// Drop what was written, including part of a buffer.
		for n > 0 && len(bufs) > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return total, nil
}

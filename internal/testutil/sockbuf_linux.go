package testutil

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/udskit/udskit/internal/proc"
)

// SendBuffer returns SO_SNDBUF of c as the kernel reports it: twice the value
// last set (capped by wmem_max), or wmem_default for an untouched socket.
func SendBuffer(t testing.TB, c syscall.Conn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatalf("testutil: SyscallConn: %v", err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil {
		t.Fatalf("testutil: Control: %v", err)
	}
	if gerr != nil {
		t.Fatalf("testutil: SO_SNDBUF: %v", gerr)
	}
	return v
}

// WmemLimits returns net.core.wmem_default and wmem_max, skipping the test
// where /proc does not have them.
func WmemLimits(t testing.TB) (def, max int) {
	t.Helper()
	read := func(name string) int {
		v, err := proc.ReadSmall("/proc/sys/net/core/" + name)
		if err != nil {
			t.Skipf("no /proc/sys/net/core/%s: %v", name, err)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Skipf("/proc/sys/net/core/%s: %v", name, err)
		}
		return n
	}
	return read("wmem_default"), read("wmem_max")
}

package uds

import (
	"syscall"
	"testing"
)

func TestDefaultMaxConnsBelowFDLimit(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	n := DefaultMaxConns()
	if uint64(n) >= uint64(rl.Cur) || n < 16 {
		t.Fatalf("DefaultMaxConns() = %d with RLIMIT_NOFILE %d", n, rl.Cur)
	}
	old := rl
	rl.Cur = 200
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Skip(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	if n := DefaultMaxConns(); n != 200-reservedFDs {
		t.Fatalf("with a limit of 200 fds: %d", n)
	}
}

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
	if n := DefaultMaxConns(); uint64(n) >= uint64(rl.Cur) || n < 16 {
		t.Fatalf("DefaultMaxConns() = %d with RLIMIT_NOFILE %d", n, rl.Cur)
	}
	for limit, want := range map[uint64]int{200: 200 - reservedFDs, 1024: 1024 - reservedFDs, 50: 16, 1 << 40: 1<<30 - reservedFDs} {
		if got := maxConnsFor(limit); got != want {
			t.Errorf("with a limit of %d fds: %d, want %d", limit, got, want)
		}
	}
}

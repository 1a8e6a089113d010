//go:build !unix

package proc

import "time"

// SelfCPU is not available here: zeros.
func SelfCPU() (user, sys time.Duration) { return 0, 0 }

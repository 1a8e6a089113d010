//go:build !unix

package bench

import "time"

// rusage is not available here; CPU columns read 0.
func rusage() (user, sys time.Duration) { return 0, 0 }

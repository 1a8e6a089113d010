//go:build !linux

package spinread

// osYield is sched_yield(2) on Linux; elsewhere the poll only reads.
func osYield() {}

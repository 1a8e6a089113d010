package spinread

import "syscall"

// osYield gives the CPU to another runnable thread of the machine, if one
// waits for it (sched_yield(2)); without one it returns at once. A poll
// yields between its reads so that, on a busy machine, it does not keep
// the CPU its peer needs to answer.
func osYield() {
	syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}

// Package spinread reads a socket for a lone waiter that expects its answer
// within microseconds: before it parks in the netpoller, a Read polls the
// socket with non-blocking reads for a bounded time.
//
// Why: a one-call ping-pong (one caller, one item each way per round) waits
// for each answer with nothing else to do. Parked, the waiting goroutine's
// thread sleeps, its CPU goes idle, and on a virtual machine an idle vCPU
// halts; the answer then waits for the host to wake that vCPU. On the
// project's Firecracker VM (cpuidle driver haltpoll, guest_halt_poll_ns 0)
// that wake is what makes one round trip in several 50–150 µs slower than
// the rest (docs/performance.md, "Bidirectional calls"). Polling for a few
// tens of microseconds keeps the CPU awake for the answer.
//
// The poll is bounded and adaptive (Reader.Read): it runs only while the
// reader is armed (Reader.Arm, by the one goroutine that reads) and its
// lone check holds, for at most Reader's bound, yielding the CPU
// (sched_yield on Linux) between reads. A poll that finds nothing within
// the bound makes the next 1, 2, 4 … 1,024 waits (doubling with each miss
// in a row, until a poll finds its data) park without polling, so a slow
// peer costs about one bound of CPU per 1,024 waits; a round of the poll
// that comes back late (the thread lost its CPU to another) stops it
// the same way, so on a busy machine the reader parks. A read deadline
// (the interrupt of a waiter whose ctx ended) and a close end the poll at
// once: each poll goes through the connection's syscall.RawConn, which
// checks both, and the blocking read that follows reports them.
package spinread

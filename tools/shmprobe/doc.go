// Command shmprobe answers one question of issue 32 with numbers: can any
// signalling design move 16 callers × 64 KiB echoes between two processes
// at 4x the bare socket echo on this machine? It is a probe, not a library:
// it changes nothing in udskit and speaks no udskit protocol.
//
// The client (this process) runs N caller goroutines, each echoing a
// payload of S bytes with every answer checked (byte for byte by default,
// -check stamp compares only the per-call stamps); the server is a child
// process (this binary re-executed) given a sealed memfd (internal/shm's
// Create and OpenOffer) and/or socketpairs. Each round runs every variant
// once, in rotated order, so the floor and the variants see the same load:
//
//	raw    the floor: N socketpairs, the client writes S bytes with one
//	       write and reads S bytes with io.ReadFull; the server the same
//	       (udskit bench's raw-unix shape).
//	sock   (a) the payload in the region (a request slot and an answer slot
//	       per caller), a 16-byte descriptor frame over K socketpairs each
//	       way (-sock-conns); the server reads a batch of frames, copies
//	       each request slot into its answer slot and writes all answer
//	       frames with one write: today's design stripped to the bone.
//	futex  (b) no socket: per-caller state words in the region (request
//	       sequence, answer sequence) and two doorbell words; each side
//	       spins for -spin, then sets its "sleeping" word and waits with
//	       FUTEX_WAIT on the shared mapping; the other side calls
//	       FUTEX_WAKE only when that word says it sleeps. The client has one
//	       poller goroutine that hands answers to parked callers.
//	futexd (b') the same words, but no poller: a caller that finds no
//	       answer after a few looks says it sleeps (a word in its line) and
//	       waits with FUTEX_WAIT on its own answer word; the server wakes
//	       that word after the answer when the caller said so. One wake,
//	       straight to the thread that needs it (a thread per sleeping
//	       caller).
//	spin   (c) the same words, nobody ever sleeps: the server spins on one
//	       thread, callers spin (runtime.Gosched) on their own answer word.
//	       The ceiling of any signalling, and what it costs the other
//	       process.
//
// A suffix /cN runs the client with GOMAXPROCS N for that variant, /sN the
// server child with GOMAXPROCS N, /wN (futex, futexd) spins N µs instead of
// -spin, /gN (futex, futexd) lets a caller look N times (runtime.Gosched)
// before it parks, instead of 4 (e.g. futex/c1, spin/s1, futex/w0/g0/c1).
//
// Per variant it prints req/s, the ratio to the floor of the same round
// (median over rounds, and each round's), CPU µs per call of both processes
// together (from /proc/PID/stat of each, 10 ms ticks) with the client's and
// the server's share, the floor's CPU per call divided by the variant's
// (the rate ratio two fully busy cores would give; load from other programs
// disturbs it less than the rates), and p50 latency. A cell starts
// measuring once its child says it serves; a cell with no call, an error or
// a wrong answer fails the run. docs/shm-ring.md is the design the futexd
// variant stands for.
//
//	go run ./tools/shmprobe -duration 1s -repeat 3
//
// Every loop is bounded: a cell runs -warmup plus -duration, a caller waits
// at most 2 s for an answer, the child exits with its parent (Pdeathsig)
// and after -duration plus 30 s at the latest.
package main

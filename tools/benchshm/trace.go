package main

import (
	"fmt"
	"os"
	"runtime/trace"
	"strconv"
	"time"
)

// traceEnv names a file prefix: when set (in the client's environment, and
// through -server-env in the servers'), each process writes a Go execution
// trace of traceSpan, starting traceAfter after it started, to
// PREFIX.PID.trace (`go tool trace -pprof=sched FILE` and friends read it).
// It shows the hand-offs of a cell: goroutine wakes, blocking syscalls,
// Ps taken from threads asleep in FUTEX_WAIT.
const traceEnv = "UDSKIT_BENCHSHM_TRACE"

const (
	traceAfter = 1500 * time.Millisecond
	traceSpan  = 300 * time.Millisecond
)

func traceFromEnv() {
	prefix := os.Getenv(traceEnv)
	if prefix == "" {
		return
	}
	time.AfterFunc(traceAfter, func() {
		path := prefix + "." + strconv.Itoa(os.Getpid()) + ".trace"
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udskit-benchshm: trace:", err)
			return
		}
		if err := trace.Start(f); err != nil {
			fmt.Fprintln(os.Stderr, "udskit-benchshm: trace:", err)
			f.Close()
			return
		}
		time.AfterFunc(traceSpan, func() {
			trace.Stop()
			f.Close()
		})
	})
}

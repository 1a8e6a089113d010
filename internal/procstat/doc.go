// Package procstat reads what udskit's measuring programs (bench, the
// benchmark commands, the soak) record of a process: its CPU time and memory
// from Linux's /proc, and this process's own CPU time from getrusage. One
// parser of /proc/PID/stat and /proc/PID/status, not one per program.
//
// Off Linux there is no /proc: ReadStat and StatusKB report ok false.
package procstat

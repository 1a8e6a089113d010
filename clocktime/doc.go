// Package clocktime measures how expensive it is to read the clocks on this
// machine and says, in words, whether that is a problem: what `udskit timing`
// prints. It is pg_test_timing with a verdict.
//
// What is measured (see docs/timing.md for how to read each row):
//
//   - "monotonic (vDSO)": time.Since on a fixed start, which is one read of
//     Go's runtime nanotime = clock_gettime(CLOCK_MONOTONIC) through the vDSO,
//     the path C programs (and PostgreSQL) take through libc.
//   - "realtime+monotonic (vDSO)": time.Now, which reads CLOCK_REALTIME and
//     CLOCK_MONOTONIC through the vDSO (two reads).
//   - "<CLOCK> (syscall)": a raw clock_gettime system call (SYS_clock_gettime,
//     no vDSO, no Go scheduler hooks) for MONOTONIC, REALTIME, their COARSE
//     variants and BOOTTIME. This is the price when the vDSO falls back.
//
// When the vDSO row costs about as much as the syscall row, the vDSO is
// falling back to the system call: the clocksource (hpet, acpi_pm, some xen
// and VM setups) cannot be read from user space.
//
// The verdict is a pure function (Decide) of recorded inputs, so it is tested
// on recordings of machines that are not this one.
package clocktime

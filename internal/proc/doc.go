// Package proc is udskit's one reader of Linux's /proc: the table of unix
// sockets (/proc/net/unix), a process's command name (/proc/PID/comm), its
// status (/proc/PID/status: ids, groups, capabilities, memory), its CPU times
// (/proc/PID/stat), the sockets among its open files and their count
// (/proc/PID/fd), and small kernel files (ReadSmall: /proc/cpuinfo,
// /proc/sys/...). Every other package asks here instead of opening /proc
// itself.
//
// Every read is capped (MaxComm, MaxStatus, MaxStat, MaxNetUnixBytes and
// MaxNetUnixLine, MaxFDs, MaxSmallFile), so a broken or hostile /proc (or a ProcRoot a
// test points elsewhere) costs bounded memory and time. Files that do not fit
// are an error, except comm (the kernel bounds it at 16 bytes; cut at
// MaxComm) and ReadSmall's files (cut at MaxSmallFile).
//
// The format of /proc/net/unix is one header line, then one line per socket:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 12345 /run/x.sock
//
// Flags has __SO_ACCEPTCON (0x10000) set for a listening socket; the path is
// the rest of the line and may contain spaces ("@name" for the abstract
// namespace, absent for an unnamed socket). Lines that do not parse are
// skipped and counted.
//
// Off Linux there is no /proc: the readers report not found (ok false, or an
// error).
//
// May import: the standard library only.
package proc

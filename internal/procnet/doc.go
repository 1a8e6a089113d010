// Package procnet is udskit's one parser of Linux's /proc/net/unix, the
// kernel's table of unix sockets. uds uses it to find the process behind a
// listening socket; socklist uses it when sock_diag is unavailable.
//
// The format is one header line, then one line per socket:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 12345 /run/x.sock
//
// Flags has __SO_ACCEPTCON (0x10000) set for a listening socket; the path is
// the rest of the line and may contain spaces ("@name" for the abstract
// namespace, absent for an unnamed socket).
//
// Caps: at most MaxBytes of input are read and a line longer than MaxLine is
// an error, so a broken or hostile input costs bounded memory and time.
// Lines that do not parse are skipped and counted.
package procnet

// Package doctor explains why a unix socket (or TCP) address cannot be
// reached: what `udskit doctor ADDR` prints.
//
// Run performs ordered checks, each with a status (PASS, WARN, FAIL, SKIP),
// a sentence saying what it means and a fix:
//
//  1. address syntax (uds.ParseAddr)
//  2. path length against the OS limit (sun_path: 107 bytes on Linux)
//  3. every parent directory exists and is searchable by this user
//  4. the path exists
//  5. it is a socket, not a regular file or directory
//  6. this user may write it (connect(2) needs write permission)
//  7. a process listens on it (socklist: pid and command), or it is stale
//  8. an actual connect, with the errno explained (uds.Dial)
//  9. a protocol sniff where safe (see Identify and Options.Probe)
//  10. for a udskit server, its statistics (udskit.stats): the shared-memory
//     regions, their fill level and the payloads that waited for space,
//     WARN when some waited or the halves are nearly full (check "shm")
//
// then service hints (PostgreSQL, docker, MySQL/MariaDB, Redis: where a live
// socket of that service actually is and how to point the client at it) and,
// when the socket is missing or dead, whether this is a container or a file
// shared from another kernel, since unix sockets do not cross kernels.
//
// Permission checks use faccessat(2) with AT_EACCESS, i.e. the effective
// uid/gid and groups of this process, which is what connect(2) uses. Run the
// doctor as the user that fails to connect.
package doctor

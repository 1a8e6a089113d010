//go:build !unix

package uds

// udskit is for unix systems: Linux (everything), macOS and the BSDs (no
// abstract sockets, socklist or splice). Windows is not supported; this
// undefined name makes a Windows build say so.
const _ = udskit_needs_a_unix_system__Linux_macOS_or_BSD

// Package uds is udskit's transport layer: listening and dialing on unix domain
// sockets (and TCP, through the same calls) done right.
//
//   - One address syntax everywhere: see ParseAddr and docs/addresses.md.
//   - Listen: safe stale-socket cleanup under an advisory lock, owner-only mode
//     by default with no window of looser permissions, clear path-length errors,
//     and a Close that only unlinks a socket that is still its own.
//   - Peer credentials from the kernel (PeerCred) and an auth Policy applied
//     before a single application byte is read.
//   - Dial: optional wait-for-socket with capped, jittered backoff, and errors
//     that say in words what is wrong while keeping the errno for errors.Is.
//   - Server: an accept loop with connection limits and a graceful Shutdown.
//
// A pid in a Cred is an observation made when the connection was set up, not an
// identity: pids are reused, so authorize on uid/gid and treat the pid as a hint.
package uds

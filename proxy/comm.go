package proxy

import "github.com/udskit/udskit/internal/proc"

// peerCommand is the name of the process holding pid now (/proc/PID/comm;
// "" off Linux). Pids are reused, so this is an observation about the peer,
// not a proof.
func peerCommand(pid int32) string { return proc.Comm(int(pid)) }

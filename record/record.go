package record

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/uds"
)

// Dir is the direction of recorded bytes.
type Dir = pcapng.Dir

// Directions.
const (
	ClientToServer = pcapng.ClientToServer
	ServerToClient = pcapng.ServerToClient
)

// Peer is what the kernel said about one end of a connection.
type Peer struct {
	Cred  uds.Cred
	Comm  string // from /proc/PID/comm, read when the connection was seen
	Known bool   // false when there were no kernel credentials (TCP, pipes)
}

func (p Peer) String() string {
	if !p.Known {
		return "unknown"
	}
	s := fmt.Sprintf("pid %d uid %d gid %d", p.Cred.PID, p.Cred.UID, p.Cred.GID)
	if p.Comm != "" {
		s += " comm " + p.Comm
	}
	return s
}

// PeerOf returns the kernel credentials of the process at the other end of
// c (SO_PEERCRED) and its command name.
func PeerOf(c net.Conn) Peer {
	cr, ok := uds.CredOf(c)
	if !ok {
		return Peer{}
	}
	return Peer{Cred: cr, Comm: proc.Comm(int(cr.PID)), Known: true}
}

// ConnInfo describes one recorded connection.
type ConnInfo struct {
	// Socket is the socket's path (or address): the capture interface name.
	Socket string
	// Client is the connecting process, Server the accepting one.
	Client, Server Peer
	// Start is when the connection was accepted.
	Start time.Time
	// Note is added to the connection's comment (mode, caveats).
	Note string
	// Detail, if set, is the capture mode's own description of the
	// connection, for sinks that want more than the above: kcapture sets
	// its *kcapture.ConnInfo (both ends' processes and socket inodes, the
	// socket type). The outputs of this package do not read it.
	Detail any
}

// Comment is the connection's comment: who connected to whom.
func (ci ConnInfo) Comment() string {
	var b strings.Builder
	fmt.Fprintf(&b, "client %s; server %s", ci.Client, ci.Server)
	if ci.Note != "" {
		b.WriteString("; ")
		b.WriteString(ci.Note)
	}
	return b.String()
}

// Sink records connections. Implementations are safe for concurrent use.
type Sink interface {
	// Open starts recording a connection.
	Open(ConnInfo) Recording
	// Err returns the first error that stopped the sink from recording (a
	// full disk, a closed pipe), or nil.
	Err() error
}

// Recording receives one connection's events, from any goroutine. Its
// methods never fail the relay: a sink that cannot record reports it
// through Sink.Err.
type Recording interface {
	// Data records bytes sent in dir at t; note, if any, is a comment.
	Data(dir Dir, t time.Time, p []byte, note string)
	// End records that dir finished sending (EOF, half-close).
	End(dir Dir, t time.Time)
	// Close ends the recording; reset says the connection was reset or
	// failed rather than closed cleanly. Calls after the first do nothing.
	Close(reset bool, t time.Time)
}

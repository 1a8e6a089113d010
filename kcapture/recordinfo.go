package kcapture

import (
	"fmt"
	"strings"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/record"
	"github.com/udskit/udskit/uds"
)

// ForCapture returns s: Sink is record.Sink, the interface every capture
// mode writes to, so no adapter is needed any more. Kept so that existing
// code (kcapture.ForCapture(capture.NewPcapSink(...))) builds unchanged.
func ForCapture(s record.Sink) Sink { return s }

// socketpairName is the interface name of connections with no bound name.
const socketpairName = "unnamed unix sockets (socketpair)"

// Record describes the connection in the vocabulary every output shares:
// the socket's path (the capture interface), the first process of each end,
// and a note with how it was seen and what record.Peer cannot hold (socket
// inodes, further processes sharing an end). Detail is c itself.
func (c *ConnInfo) Record(t time.Time) record.ConnInfo {
	name := c.Path
	if name == "" {
		name = socketpairName
	}
	return record.ConnInfo{Socket: name, Client: peerOf(c.Client), Server: peerOf(c.Server), Start: t,
		Note: kernelNote(c), Detail: c}
}

// peerOf is the first process of an end as record.Peer.
func peerOf(e End) record.Peer {
	if len(e.Procs) == 0 || e.Procs[0].UID < 0 {
		return record.Peer{}
	}
	p := e.Procs[0]
	return record.Peer{Cred: uds.Cred{PID: int32(p.PID), UID: uint32(p.UID), GID: uint32(p.GID)}, Comm: p.Command, Known: true}
}

// kernelNote says how the connection was seen and what record.Peer cannot
// hold: socket inodes and further processes sharing an end.
func kernelNote(info *ConnInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kernel capture (eBPF), unix %s", proc.TypeName(uint16(info.SockType)))
	for _, side := range []struct {
		name string
		e    End
	}{{"client", info.Client}, {"server", info.Server}} {
		if side.e.Inode == 0 && len(side.e.Procs) <= 1 {
			continue
		}
		fmt.Fprintf(&b, "; %s %s", side.name, side.e)
	}
	return b.String()
}

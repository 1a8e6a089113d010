package kcapture

import (
	"fmt"
	"strings"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/uds"
)

// ForCapture adapts a capture.Sink — the pcapng and text outputs every
// capture mode shares, with their port choice, rotation and live view — to
// Sink. Lost bytes and dropped events go to the sink's capture.LostRecorder
// and capture.DropRecorder when it has them, else into notes.
func ForCapture(s capture.Sink) Sink { return captureSink{s} }

type captureSink struct{ s capture.Sink }

func (c captureSink) OpenConn(info ConnInfo, t time.Time) (ConnSink, error) {
	if err := c.s.Err(); err != nil {
		return nil, err
	}
	name := info.Path
	if name == "" {
		name = "unnamed unix sockets (socketpair)"
	}
	rec := c.s.Open(capture.ConnInfo{
		Socket: name,
		Client: peerOf(info.Client),
		Server: peerOf(info.Server),
		Start:  t,
		Note:   kernelNote(&info),
	})
	return captureConn{s: c.s, rec: rec}, nil
}

func (c captureSink) Dropped(t time.Time, n uint64, comment string) error {
	if d, ok := c.s.(capture.DropRecorder); ok {
		d.Dropped(t, n, comment)
	}
	return c.s.Err()
}

// peerOf is the first process of an end as capture.Peer.
func peerOf(e End) capture.Peer {
	if len(e.Procs) == 0 || e.Procs[0].UID < 0 {
		return capture.Peer{}
	}
	p := e.Procs[0]
	return capture.Peer{Cred: uds.Cred{PID: int32(p.PID), UID: uint32(p.UID), GID: uint32(p.GID)}, Comm: p.Command, Known: true}
}

// kernelNote says how the connection was seen and what capture.Peer cannot
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

type captureConn struct {
	s   capture.Sink
	rec capture.Recording
}

func (c captureConn) Data(dir Dir, t time.Time, p []byte, note string) error {
	c.rec.Data(capture.Dir(dir), t, p, note)
	return c.s.Err()
}

func (c captureConn) Lost(dir Dir, t time.Time, n int64) error {
	if l, ok := c.rec.(capture.LostRecorder); ok {
		l.Lost(capture.Dir(dir), t, n)
	} else {
		c.rec.Data(capture.Dir(dir), t, nil, fmt.Sprintf("%d bytes not captured", n))
	}
	return c.s.Err()
}

func (c captureConn) End(dir Dir, t time.Time) error {
	c.rec.End(capture.Dir(dir), t)
	return c.s.Err()
}

func (c captureConn) Close(reset bool, t time.Time) error {
	c.rec.Close(reset, t)
	return c.s.Err()
}

package kcapture

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func msg(sock, peer uint64, flags uint8, kind Kind, data string) *Message {
	m := &Message{Chunk: Chunk{Sock: sock, Peer: peer, Flags: flags, Kind: kind, SockType: SockStream, Len: uint32(len(data)), PID: uint32(sock), Comm: "p"}}
	if kind >= KindRead {
		m.Flags |= flagRecv
	}
	m.Pieces = []Piece{{Data: []byte(data)}}
	return m
}

// Both ends of a connection map to one flow; the bound end is the server;
// each direction is taken from one end only (the other end's copy of the
// same bytes is set aside); lost bytes are passed on.
func TestTrackerPairsEnds(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	const cli, srv = 100, 200
	tr.Message(msg(cli, srv, flagPeerBound, KindWrite, "ping")) // client sends
	tr.Message(msg(srv, cli, flagOwnBound, KindRead, "ping"))   // server reads the same bytes
	tr.Message(msg(srv, cli, flagOwnBound, KindWrite, "pong"))  // server replies
	tr.Message(msg(cli, srv, flagPeerBound, KindRead, "pong"))  // client reads it
	lost := msg(cli, srv, flagPeerBound, KindWrite, "")
	lost.Pieces = []Piece{{Lost: 7}}
	tr.Message(lost)
	if len(sink.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(sink.conns))
	}
	c := sink.conns[0]
	if c.data[ClientToServer].String() != "ping" || c.data[ServerToClient].String() != "pong" {
		t.Errorf("c2s %q s2c %q", c.data[0].String(), c.data[1].String())
	}
	if c.lost[ClientToServer] != 7 {
		t.Errorf("lost %d, want 7", c.lost[ClientToServer])
	}
	if tr.Stats.Duplicates != 2 {
		t.Errorf("duplicates %d, want 2", tr.Stats.Duplicates)
	}
	if c.info.Client.Procs[0].PID != cli || c.info.Server.Inode != 0 {
		t.Errorf("ends: %+v", c.info)
	}
	if !strings.Contains(c.info.Comment(), "client pid 100") {
		t.Errorf("comment %q", c.info.Comment())
	}
}

// Seen only from the server end (a server selected by pid): the server's
// reads carry client->server, its writes server->client.
func TestTrackerServerSideOnly(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	tr.Message(msg(2, 1, flagOwnBound, KindRecvfrom, "q"))
	tr.Message(msg(2, 1, flagOwnBound, KindSendto, "a"))
	c := sink.conns[0]
	if c.data[ClientToServer].String() != "q" || c.data[ServerToClient].String() != "a" {
		t.Errorf("c2s %q s2c %q", c.data[0].String(), c.data[1].String())
	}
	if c.info.Server.Procs[0].PID != 2 {
		t.Errorf("server end %+v", c.info.Server)
	}
}

func TestReorder(t *testing.T) {
	var out []uint64
	r := reorder{emit: func(m *Message) { out = append(out, m.Mono) }}
	for _, ts := range []uint64{5, 3, 9, 1} {
		r.push(&Message{Chunk: Chunk{Mono: ts}})
	}
	r.drain(5)
	if len(out) != 3 || out[0] != 1 || out[1] != 3 || out[2] != 5 {
		t.Errorf("drained %v", out)
	}
	r.flush()
	if len(out) != 4 || out[3] != 9 {
		t.Errorf("flushed %v", out)
	}
}

// EOF seen by each reader ends that direction; both ended close the flow,
// and later traffic on the same sockets opens a new one. A reset closes at
// once.
func TestTrackerEnds(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	eof := func(sock, peer uint64, flags uint8) *Message {
		m := msg(sock, peer, flags|flagEOF, KindRead, "")
		m.Pieces = nil
		return m
	}
	tr.Message(msg(1, 2, flagPeerBound, KindWrite, "x"))
	tr.Message(eof(2, 1, flagOwnBound)) // server sees the client's EOF
	c := sink.conns[0]
	if !c.ended[ClientToServer] || c.ended[ServerToClient] || c.closed {
		t.Fatalf("after the client's EOF: %+v", c)
	}
	tr.Message(eof(1, 2, flagPeerBound)) // client sees the server's EOF
	if !c.closed || c.reset || tr.Stats.Closed != 1 {
		t.Fatalf("after both EOFs: closed %v reset %v stats %+v", c.closed, c.reset, tr.Stats)
	}
	tr.Message(msg(1, 2, flagPeerBound, KindWrite, "y"))
	if len(sink.conns) != 2 {
		t.Fatalf("traffic after close: %d flows, want 2", len(sink.conns))
	}
	r := msg(2, 1, flagOwnBound|flagReset, KindRead, "")
	r.Pieces = nil
	tr.Message(r)
	if !sink.conns[1].closed || !sink.conns[1].reset {
		t.Errorf("reset did not close the flow: %+v", sink.conns[1])
	}
}

// A whole message the ring buffer dropped shows as a gap in the socket's
// byte count: the flow marks those bytes lost.
func TestTrackerStreamGap(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	at := func(off uint64, data string) *Message {
		m := msg(1, 2, flagPeerBound, KindWrite, data)
		m.StreamOff = off
		return m
	}
	tr.Message(at(100, "abc")) // first seen: no gap before it
	tr.Message(at(103, "de"))
	tr.Message(at(110, "xyz")) // 105..110 never arrived
	c := sink.conns[0]
	if got := c.data[ClientToServer].String(); got != "abcdexyz" {
		t.Errorf("data %q", got)
	}
	if c.lost[ClientToServer] != 5 || tr.Stats.GapBytes != 5 {
		t.Errorf("lost %d gap %d, want 5", c.lost[ClientToServer], tr.Stats.GapBytes)
	}
}

// Whole messages dropped at the end of a capture are revealed by no later
// message: Tail marks them from the sockets' final byte counts, for the
// direction's source end only, and not for a direction that has ended.
func TestTrackerTail(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	w := msg(4, 8, flagPeerBound, KindWrite, "abc") // client 4 (inode 40) writes
	w.StreamOff, w.Inode, w.PeerInode = 100, 40, 80
	tr.Message(w)
	r := msg(4, 8, flagPeerBound, KindRead, "xy") // client 4 reads what server 8 sent (from its own reads)
	r.StreamOff, r.Inode, r.PeerInode = 40, 40, 80
	tr.Message(r)
	var asked []uint64
	// The counters are by socket inode (bit 0: the received count).
	counts := map[uint64]uint64{40 << 1: 110, 40<<1 | 1: 45, 80 << 1: 999, 80<<1 | 1: 999}
	count := func(ino uint64, recv bool) (uint64, bool) {
		k := ino << 1
		if recv {
			k |= 1
		}
		asked = append(asked, k)
		n, ok := counts[k]
		return n, ok
	}
	tr.Tail(time.Unix(1, 0), count)
	c := sink.conns[0]
	if c.lost[ClientToServer] != 7 || c.lost[ServerToClient] != 3 || tr.Stats.GapBytes != 10 {
		t.Errorf("lost c2s %d s2c %d gap %d, want 7, 3, 10 (asked %v)", c.lost[ClientToServer], c.lost[ServerToClient], tr.Stats.GapBytes, asked)
	}
	tr.Tail(time.Unix(2, 0), count)
	if tr.Stats.GapBytes != 10 {
		t.Errorf("a second Tail marked again: gap %d", tr.Stats.GapBytes)
	}
}

// Record describes a kernel connection in the vocabulary every output
// shares: the path (or the socketpair interface), the first process of each
// end with known credentials, and a note with the socket type, inodes and
// the further processes; Detail is the kernel's own description.
func TestConnInfoRecord(t *testing.T) {
	ci := &ConnInfo{SockType: SockStream,
		Client: End{Inode: 11, Procs: []Proc{{PID: 100, UID: 1000, GID: 1001, Command: "psql"}, {PID: 101, UID: -1, GID: -1, Command: "sh"}}},
		Server: End{Procs: []Proc{{PID: 200, UID: -1, GID: -1, Command: "postgres"}}}}
	now := time.Now()
	r := ci.Record(now)
	if r.Socket != socketpairName || r.Start != now || r.Detail != ci {
		t.Errorf("record.ConnInfo %+v", r)
	}
	if !r.Client.Known || r.Client.Cred.PID != 100 || r.Client.Cred.UID != 1000 || r.Client.Cred.GID != 1001 || r.Client.Comm != "psql" {
		t.Errorf("client %+v", r.Client)
	}
	if r.Server.Known {
		t.Errorf("server with unknown uid shown as known: %+v", r.Server)
	}
	for _, want := range []string{"kernel capture (eBPF), unix stream", "client pid 100 (psql) uid 1000 gid 1001, pid 101 (sh) socket:[11]"} {
		if !strings.Contains(r.Note, want) {
			t.Errorf("note %q lacks %q", r.Note, want)
		}
	}
	if strings.Contains(r.Note, "server") {
		t.Errorf("note %q describes a plain server end", r.Note)
	}
	ci.Path = "/run/pg.sock"
	if r := ci.Record(now); r.Socket != "/run/pg.sock" {
		t.Errorf("socket %q", r.Socket)
	}
}

// The kernel reuses a freed socket's memory: a new connection often gets
// the two kernel sockets (the Tracker's key) of one that ended, the ends
// swapped or not. Such a connection had been written into the old flow,
// its client's bytes as the server's when swapped (tshark then decoded
// psql's queries as PostgreSQL's answers: TestExtcapTsharkKernel saw no
// pgsql.query); the sockets' inodes tell them apart: each is its own
// flow, with its own direction, and the old one is closed.
func TestTrackerReusedSocketAddresses(t *testing.T) {
	sink := &fakeSink{}
	tr := &Tracker{Sink: sink}
	conn := func(cli, cliIno, srv, srvIno uint64, n int) {
		q := msg(cli, srv, flagPeerBound, KindWrite, fmt.Sprintf("Q%d", n))
		q.Inode, q.PeerInode = cliIno, srvIno
		r := msg(srv, cli, flagOwnBound, KindWrite, fmt.Sprintf("R%d", n))
		r.Inode, r.PeerInode = srvIno, cliIno
		tr.Message(q)
		tr.Message(r)
	}
	conn(100, 11, 200, 21, 1)
	conn(200, 31, 100, 41, 2) // the ends swapped
	conn(200, 51, 100, 61, 3) // the same way round
	conn(200, 51, 100, 61, 4) // the same connection again
	if len(sink.conns) != 3 {
		t.Fatalf("%d connections, want 3", len(sink.conns))
	}
	for i, want := range [][2]string{{"Q1", "R1"}, {"Q2", "R2"}, {"Q3Q4", "R3R4"}} {
		c := sink.conns[i]
		if got := [2]string{c.data[ClientToServer].String(), c.data[ServerToClient].String()}; got != want {
			t.Errorf("connection %d: client->server %q, server->client %q; want %q", i, got[0], got[1], want)
		}
		if c.closed != (i < 2) {
			t.Errorf("connection %d: closed %v", i, c.closed)
		}
	}
	if c := sink.conns[1].info; c.Client.Inode != 31 || c.Server.Inode != 41 {
		t.Errorf("second connection's ends: client %v, server %v", c.Client, c.Server)
	}
}

package kcapture

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/record"
)

// Dir is a direction within a connection: an alias of record.Dir.
type Dir = record.Dir

const (
	// ClientToServer is data the connecting end sent.
	ClientToServer = record.ClientToServer
	// ServerToClient is data the accepting (bound) end sent.
	ServerToClient = record.ServerToClient
)

// Sink receives the connections a capture reconstructs: an alias of
// record.Sink, the interface every capture mode writes to (record.PcapSink,
// record.TextSink, or your own). Each connection is opened with a
// record.ConnInfo whose Detail is this package's *ConnInfo (both ends'
// processes and socket inodes, the socket type, the first bytes). Datagram
// and seqpacket messages arrive as one Data each, kept whole. Lost bytes go
// to the Recording's record.LostRecorder and dropped events to the Sink's
// record.DropRecorder when they have them (record.Lost, record.Dropped).
type Sink = record.Sink

// ConnSink receives one connection's data: an alias of record.Recording.
type ConnSink = record.Recording

// ConnInfo describes a connection when it is first seen.
type ConnInfo struct {
	// Path is the bound name of the server end ("" for a socketpair or when
	// unknown).
	Path     string
	SockType uint8 // SockStream, SockDgram, SockSeqpacket
	Client   End
	Server   End
	// First is the first captured data and FirstDir its direction.
	First    []byte
	FirstDir Dir
}

// Comment is the connection's description for the capture file: both ends'
// processes and sockets.
func (c *ConnInfo) Comment() string {
	return fmt.Sprintf("unix %s: client %s; server %s", proc.TypeName(uint16(c.SockType)), c.Client, c.Server)
}

// End is one end of a connection.
type End struct {
	Inode uint64
	// Procs hold the socket: the one seen in the kernel events first, then
	// owners found in /proc (a socket inherited across fork has several).
	Procs []Proc
}

// Proc is a process at one end.
type Proc struct {
	PID      int
	UID, GID int // -1 when unknown (found in /proc, not seen in an event)
	Command  string
}

func (e End) String() string {
	var b strings.Builder
	if len(e.Procs) == 0 {
		b.WriteString("process unknown")
	}
	for i, p := range e.Procs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "pid %d (%s)", p.PID, p.Command)
		if p.UID >= 0 {
			fmt.Fprintf(&b, " uid %d gid %d", p.UID, p.GID)
		}
	}
	if e.Inode != 0 {
		fmt.Fprintf(&b, " socket:[%d]", e.Inode)
	}
	return b.String()
}

// Resolver finds, outside the kernel events, who holds a socket inode and the
// name it is bound to (via /proc and sock_diag). It may return nothing.
type Resolver func(inode uint64) (procs []Proc, path string)

// TrackerStats counts what the Tracker did.
type TrackerStats struct {
	Conns    int
	Closed   int    // connections whose both directions ended (EOF seen)
	Messages uint64 // messages written
	Bytes    uint64 // bytes written
	// Duplicates are messages not written because the same bytes are taken
	// from the other end of the connection (each byte is sent by one end and
	// received by the other; a direction is taken from whichever end is seen
	// first).
	Duplicates uint64
	LostBytes  uint64 // bytes marked lost (not captured, or beyond snaplen)
	GapBytes   uint64 // of those, bytes of whole messages that never arrived
	Errors     uint64 // sink errors
}

// Tracker pairs both ends of each connection and writes its messages to a
// Sink. Connections are keyed by the unordered pair of kernel sockets, so
// events of either end land in the same flow. Not safe for concurrent use.
type Tracker struct {
	Sink    Sink
	Resolve Resolver // optional
	// BoundPath, if set, names the socket file with this inode and device
	// (kernel encoding) when the connection's own ends are gone.
	BoundPath func(ino uint64, dev uint32) string
	// Comm, if set, returns a process's command name ("" if unknown).
	Comm func(pid int) string
	// Clock converts a CLOCK_MONOTONIC timestamp to wall time.
	Clock func(mono uint64) time.Time

	Stats    TrackerStats
	conns    map[[2]uint64]*conn
	resolved map[uint64]resolved // Resolve's answers, by inode
	err      error
}

type resolved struct {
	procs []Proc
	path  string
}

// Seen resolves the inodes of a message's ends as soon as it arrives, before
// it waits in the reorder window: a short-lived connection may be gone from
// /proc by the time its flow is opened.
func (t *Tracker) Seen(m *Message) {
	if t.Resolve == nil {
		return
	}
	for _, ino := range []uint64{m.Inode, m.PeerInode} {
		t.lookup(ino)
	}
}

// lookup returns (and caches) what Resolve says about inode.
func (t *Tracker) lookup(inode uint64) resolved {
	if inode == 0 || t.Resolve == nil {
		return resolved{}
	}
	if r, ok := t.resolved[inode]; ok {
		return r
	}
	if t.resolved == nil || len(t.resolved) >= maxConns {
		t.resolved = make(map[uint64]resolved)
	}
	var r resolved
	r.procs, r.path = t.Resolve(inode)
	t.resolved[inode] = r
	return r
}

type conn struct {
	sink   record.Recording
	client uint64  // kernel socket of the client end
	ended  [2]bool // by Dir: EOF seen
	// src says, per Dir, which side's events carry that direction's bytes:
	// 0 not yet decided, srcSend (the sender's writes) or srcRecv (the
	// receiver's reads).
	src [2]uint8
	// next is, per Dir, the stream offset (Chunk.StreamOff) the next message
	// should start at; a message starting later follows bytes that never
	// arrived (whole messages the ring buffer dropped).
	next    [2]uint64
	hasNext [2]bool
	// ino is the socket inode of each end, by its place in the key (0:
	// not known yet). The key's kernel sockets are addresses the kernel
	// reuses once a socket is freed (the next connection often gets the
	// same two, the ends swapped or not); the inodes tell connections
	// apart.
	ino [2]uint64
}

// same reports whether m belongs to c, the connection under key: no end's
// inode differs from the one known; it records the inodes not known yet.
func (c *conn) same(key [2]uint64, m *Message) bool {
	var ino [2]uint64
	for i, sk := range key {
		switch {
		case sk == m.Sock:
			ino[i] = m.Inode
		case sk == m.Peer:
			ino[i] = m.PeerInode
		}
		if ino[i] != 0 && c.ino[i] != 0 && ino[i] != c.ino[i] {
			return false
		}
	}
	for i := range ino {
		if c.ino[i] == 0 {
			c.ino[i] = ino[i]
		}
	}
	return true
}

const (
	srcSend = 1
	srcRecv = 2
)

// maxConns bounds the connections tracked; beyond it the oldest are forgotten
// (their later traffic then opens a new flow).
const maxConns = 65536

// Err is the first sink error.
func (t *Tracker) Err() error { return t.err }

// Message writes one message to its connection.
func (t *Tracker) Message(m *Message) {
	if t.conns == nil {
		t.conns = make(map[[2]uint64]*conn)
	}
	key := [2]uint64{m.Sock, m.Peer}
	if key[1] != 0 && key[1] < key[0] {
		key[0], key[1] = key[1], key[0]
	}
	c := t.conns[key]
	if c != nil && !c.same(key, m) {
		// The kernel reused the sockets' memory for a new connection: the
		// old one is over (its sockets were freed).
		c.sink.Close(false, t.time(m.Mono))
		delete(t.conns, key)
		t.check()
		c = nil
	}
	isClient := false
	if c != nil {
		isClient = c.client == m.Sock
	} else {
		isClient = clientEnd(&m.Chunk)
	}
	dir := ClientToServer
	if isClient == m.Recv() {
		dir = ServerToClient
	}
	if m.End() {
		t.end(key, c, dir, m)
		return
	}
	src := uint8(srcSend)
	if m.Recv() {
		src = srcRecv
	}
	if c != nil && c.src[dir] != 0 && c.src[dir] != src {
		t.Stats.Duplicates++
		return
	}
	ts := t.time(m.Mono)
	if c == nil {
		if err := t.Sink.Err(); err != nil {
			t.fail(err)
			return
		}
		if len(t.conns) >= maxConns {
			clear(t.conns)
		}
		c = &conn{client: m.Sock}
		if !isClient {
			c.client = m.Peer
		}
		c.same(key, m) // records the ends' inodes
		info := t.info(m, isClient, dir)
		c.sink = t.Sink.Open(info.Record(ts))
		t.conns[key] = c
		t.Stats.Conns++
	}
	defer t.check()
	c.src[dir] = src
	if c.hasNext[dir] && m.StreamOff > c.next[dir] {
		gap := m.StreamOff - c.next[dir]
		t.Stats.LostBytes += gap
		t.Stats.GapBytes += gap
		record.Lost(c.sink, dir, ts, int64(gap))
	}
	if end := m.StreamOff + uint64(m.Len); !c.hasNext[dir] || end > c.next[dir] {
		c.next[dir], c.hasNext[dir] = end, true
	}
	note := ""
	if m.NFDs > 0 {
		note = fmt.Sprintf("%s passed %d fd(s) with SCM_RIGHTS", m.Kind, m.NFDs)
	}
	t.Stats.Messages++
	for _, p := range m.Pieces {
		if p.Lost > 0 {
			t.Stats.LostBytes += uint64(p.Lost)
			record.Lost(c.sink, dir, ts, p.Lost)
			continue
		}
		t.Stats.Bytes += uint64(len(p.Data))
		c.sink.Data(dir, ts, p.Data, note)
		note = ""
	}
}

// Tail marks, at the end of a capture, the bytes each direction of each
// open connection moved after its last captured message: whole messages the
// ring buffer dropped at the end, which no later message revealed as a gap.
// sent returns the final byte count of the socket with inode ino
// (Chunk.StreamOff's counter; recv: the received count), ok false when
// unknown. Nothing is marked for a connection whose other end is unknown.
func (t *Tracker) Tail(ts time.Time, sent func(ino uint64, recv bool) (uint64, bool)) {
	for key, c := range t.conns {
		other := key[0]
		if other == c.client {
			other = key[1]
		}
		for _, dir := range []Dir{ClientToServer, ServerToClient} {
			if !c.hasNext[dir] || c.ended[dir] || other == 0 {
				continue
			}
			from, to := c.client, other
			if dir == ServerToClient {
				from, to = other, c.client
			}
			sock, recv := from, false
			if c.src[dir] == srcRecv {
				sock, recv = to, true
			}
			ino := c.ino[0]
			if sock == key[1] {
				ino = c.ino[1]
			}
			if ino == 0 {
				continue
			}
			end, ok := sent(ino, recv)
			if !ok || end <= c.next[dir] {
				continue
			}
			gap := end - c.next[dir]
			t.Stats.LostBytes += gap
			t.Stats.GapBytes += gap
			record.Lost(c.sink, dir, ts, int64(gap))
			c.next[dir] = end
			t.check()
		}
	}
}

// end handles a stream's end seen by a reader: EOF ends the direction into
// the reader (both ended: the connection is closed), a reset closes it.
// Ends of connections never seen with data are not recorded.
func (t *Tracker) end(key [2]uint64, c *conn, dir Dir, m *Message) {
	if c == nil || c.ended[dir] {
		return
	}
	ts := t.time(m.Mono)
	defer t.check()
	if m.Flags&flagReset != 0 {
		c.sink.Close(true, ts)
		delete(t.conns, key)
		return
	}
	c.ended[dir] = true
	c.sink.End(dir, ts)
	if c.ended[dir^1] {
		c.sink.Close(false, ts)
		delete(t.conns, key)
		t.Stats.Closed++
	}
}

func (t *Tracker) comm(pid int) string {
	if t.Comm == nil {
		return ""
	}
	return t.Comm(pid)
}

// check counts a sink that has failed (record.Sink.Err) after a write.
func (t *Tracker) check() { t.fail(t.Sink.Err()) }

// Dropped records n events lost before they reached the tracker, in the
// sink when it keeps drop counts (record.DropRecorder).
func (t *Tracker) Dropped(ts time.Time, n uint64, comment string) {
	record.Dropped(t.Sink, ts, n, comment)
	t.check()
}

func (t *Tracker) fail(err error) {
	if err != nil {
		t.Stats.Errors++
		if t.err == nil {
			t.err = err
		}
	}
}

func (t *Tracker) time(mono uint64) time.Time {
	if t.Clock != nil {
		return t.Clock(mono)
	}
	return time.Unix(0, int64(mono))
}

// clientEnd decides, on a connection's first message, whether the end that
// produced it is the client: the server end is the one with a bound name
// (an accepted connection carries its listener's name); when both or neither
// are bound (a socketpair), the end that sent first is the client.
func clientEnd(c *Chunk) bool {
	own, peer := c.Flags&flagOwnBound != 0, c.Flags&flagPeerBound != 0
	if own != peer {
		return peer
	}
	return !c.Recv()
}

// info builds the ConnInfo of a new connection from its first message.
func (t *Tracker) info(m *Message, isClient bool, dir Dir) ConnInfo {
	info := ConnInfo{SockType: m.SockType, FirstDir: dir}
	for _, p := range m.Pieces {
		if p.Data != nil {
			info.First = append([]byte(nil), p.Data...) // m's buffers are reused
			break
		}
	}
	self := End{Inode: m.Inode, Procs: []Proc{{PID: int(m.PID), UID: int(m.UID), GID: int(m.GID), Command: m.Comm}}}
	other := End{Inode: m.PeerInode}
	rs, ro := t.lookup(m.Inode), t.lookup(m.PeerInode)
	for _, p := range rs.procs {
		if !slices.ContainsFunc(self.Procs, func(q Proc) bool { return q.PID == p.PID }) {
			self.Procs = append(self.Procs, p)
		}
	}
	other.Procs = ro.procs
	if len(other.Procs) == 0 && m.PeerPID != 0 {
		// Gone from /proc (or not visible): the kernel's SO_PEERCRED of
		// this end still names the other end's process (as it was when it
		// connected or listened).
		other.Procs = []Proc{{PID: int(m.PeerPID), UID: int(m.PeerUID), GID: int(m.PeerGID), Command: t.comm(int(m.PeerPID))}}
	}
	selfPath, otherPath := rs.path, ro.path
	if isClient {
		info.Client, info.Server, info.Path = self, other, otherPath
	} else {
		info.Client, info.Server, info.Path = other, self, selfPath
	}
	if info.Path == "" && m.BoundIno != 0 && t.BoundPath != nil {
		info.Path = t.BoundPath(m.BoundIno, m.BoundDev)
	}
	return info
}

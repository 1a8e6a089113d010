package kcapture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Kind is the syscall that moved the bytes.
type Kind uint8

// Syscall kinds, as bpf/udscap.c numbers them.
const (
	KindWrite Kind = iota + 1
	KindWritev
	KindSendto
	KindSendmsg
	KindRead
	KindReadv
	KindRecvfrom
	KindRecvmsg
)

var kindNames = [...]string{"", "write", "writev", "sendto", "sendmsg", "read", "readv", "recvfrom", "recvmsg"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Header flags (bpf/udscap.c F_*).
const (
	flagOwnBound  = 1
	flagPeerBound = 2
	flagFault     = 4
	flagRecv      = 8
	flagEOF       = 16
	flagReset     = 32
)

// Socket types.
const (
	SockStream    = 1
	SockDgram     = 2
	SockSeqpacket = 5
)

// headerLen is sizeof(struct event) in bpf/udscap.c.
const headerLen = 128

// Chunk is one ring-buffer record: one piece of the bytes a syscall moved.
type Chunk struct {
	Mono      uint64 // CLOCK_MONOTONIC ns: entry of a send, exit of a receive
	Sock      uint64 // this end's kernel socket (identity only)
	Peer      uint64 // the peer's kernel socket, 0 if none
	Inode     uint64 // this end's socket inode (as in /proc/net/unix)
	PeerInode uint64 // 0 if unknown
	PID, TID  uint32
	UID, GID  uint32
	FD        uint32
	Len       uint32 // bytes the syscall moved
	Off       uint32 // offset of this chunk in them
	Covered   uint32 // bytes of the message this chunk covers
	NFDs      uint16 // fds passed with SCM_RIGHTS
	SockType  uint8
	Flags     uint8
	Kind      Kind
	Comm      string
	// PeerPID, PeerUID and PeerGID are this end's SO_PEERCRED: the other
	// end's process when it connected (PeerPID 0: none).
	PeerPID, PeerUID, PeerGID uint32
	// BoundIno and BoundDev identify the socket file this end is bound to,
	// else the one its peer is bound to (0: neither): an accepted
	// connection shares its listener's.
	BoundIno uint64
	BoundDev uint32
	// StreamOff is how many bytes this socket had sent (or, for received
	// data, received) before this message since the capture first saw it.
	StreamOff uint64
	Data      []byte // len(Data) == Covered unless Fault
}

// Recv reports whether the chunk is received data (read side).
func (c *Chunk) Recv() bool { return c.Flags&flagRecv != 0 }

// End reports whether the chunk is a stream's end seen by the reader (EOF
// or reset) rather than data.
func (c *Chunk) End() bool { return c.Flags&(flagEOF|flagReset) != 0 }

// Fault reports whether the user memory could not be read: Data is empty.
func (c *Chunk) Fault() bool { return c.Flags&flagFault != 0 }

// ErrRecord is wrapped by errors about malformed ring-buffer records.
var ErrRecord = errors.New("kcapture: malformed record")

// ParseChunk decodes one ring-buffer record. Data aliases b.
func ParseChunk(b []byte) (Chunk, error) {
	if len(b) < headerLen {
		return Chunk{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrRecord, len(b), headerLen)
	}
	le := binary.NativeEndian
	c := Chunk{
		Mono:      le.Uint64(b[0:]),
		Sock:      le.Uint64(b[8:]),
		Peer:      le.Uint64(b[16:]),
		Inode:     le.Uint64(b[24:]),
		PeerInode: le.Uint64(b[32:]),
		PID:       le.Uint32(b[40:]),
		TID:       le.Uint32(b[44:]),
		UID:       le.Uint32(b[48:]),
		GID:       le.Uint32(b[52:]),
		FD:        le.Uint32(b[56:]),
		Len:       le.Uint32(b[60:]),
		Off:       le.Uint32(b[64:]),
		Covered:   le.Uint32(b[68:]),
		NFDs:      le.Uint16(b[72:]),
		SockType:  b[74],
		Flags:     b[75],
		Kind:      Kind(b[76]),
		PeerPID:   le.Uint32(b[96:]),
		PeerUID:   le.Uint32(b[100:]),
		PeerGID:   le.Uint32(b[104:]),
		BoundDev:  le.Uint32(b[108:]),
		BoundIno:  le.Uint64(b[112:]),
		StreamOff: le.Uint64(b[120:]),
	}
	comm := b[80:96]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	c.Comm = string(comm)
	data := b[headerLen:]
	switch {
	case c.Fault():
		if len(data) != 0 {
			return Chunk{}, fmt.Errorf("%w: fault chunk with %d data bytes", ErrRecord, len(data))
		}
	case uint32(len(data)) != c.Covered:
		// The ring buffer pads records to 8 bytes; trust Covered when it fits.
		if uint32(len(data)) < c.Covered {
			return Chunk{}, fmt.Errorf("%w: %d data bytes, header says %d", ErrRecord, len(data), c.Covered)
		}
		data = data[:c.Covered]
	}
	if uint64(c.Off)+uint64(c.Covered) > uint64(c.Len) {
		return Chunk{}, fmt.Errorf("%w: chunk %d+%d beyond message length %d", ErrRecord, c.Off, c.Covered, c.Len)
	}
	c.Data = data
	return c, nil
}

package kcapture

import (
	"errors"
	"fmt"
)

// Selection says whose sockets to record. Exactly one field is set.
type Selection struct {
	// Path selects the sockets bound to this filesystem path (a listener's
	// accepted connections carry its bound file) and their peers.
	Path string
	// PID selects every unix socket the process (all its threads) uses.
	PID int
	// All selects every unix socket on the host.
	All bool
}

func (s Selection) String() string {
	switch {
	case s.Path != "":
		return "socket " + s.Path
	case s.PID != 0:
		return fmt.Sprintf("pid %d", s.PID)
	default:
		return "all unix sockets"
	}
}

// Validate checks that exactly one selection is made.
func (s Selection) Validate() error {
	n := 0
	if s.Path != "" {
		n++
	}
	if s.PID != 0 {
		n++
	}
	if s.All {
		n++
	}
	if n != 1 {
		return ErrSelection
	}
	if s.PID < 0 {
		return fmt.Errorf("%w: pid %d", ErrSelection, s.PID)
	}
	return nil
}

// ErrSelection is returned for a selection that is not exactly one of Path,
// PID and All.
var ErrSelection = errors.New("kcapture: select exactly one of a socket path, a pid, or all")

// Options configures Open. The zero value is invalid (Select must be set).
type Options struct {
	Select Selection
	// Snaplen bounds the bytes recorded per syscall; the rest is marked lost.
	// Default DefaultSnaplen, at most MaxSnaplen.
	Snaplen int
	// RingBytes is the ring buffer's size (a power of two). Default: 64 MiB
	// (about 130 ms of a 500 MB/s stream: room for the reader to be kept
	// off the CPU that long on a busy machine without a byte lost), or
	// 4 x Snaplen rounded up when larger, at most 256 MiB. The kernel
	// allocates it at Open and frees it at Close.
	RingBytes int
	// BothSides records what a process receives even when the sending end
	// is selected too. By default each byte of a connection whose both ends
	// are selected is recorded once, from the sender's write (the receiver's
	// reads still mark the stream's end); the receive side is kept for ends
	// whose peer may not be selected: datagrams, a peer in our own process,
	// and every read of a selection by PID (SO_PEERCRED cannot tell who
	// holds the peer: a socketpair shared across fork names its creator at
	// both ends). Set it when a sender writes with syscalls
	// that are not traced (splice, sendfile, io_uring): its bytes are then
	// taken from the receiver's reads.
	BothSides bool
	// Attach chooses the attach point: AttachAuto (default), AttachRaw or
	// AttachTracepoints.
	Attach string
	// Logf, if set, receives progress notes (which attach point is used).
	Logf func(format string, args ...any)
}

// Limits.
const (
	DefaultSnaplen = 64 << 10
	MaxSnaplen     = 64 << 20
	defaultRing    = 64 << 20
	maxRing        = 256 << 20
)

func (o *Options) normalize() error {
	if err := o.Select.Validate(); err != nil {
		return err
	}
	if o.Snaplen == 0 {
		o.Snaplen = DefaultSnaplen
	}
	if o.Snaplen < 0 || o.Snaplen > MaxSnaplen {
		return fmt.Errorf("kcapture: snaplen %d out of range 1..%d", o.Snaplen, MaxSnaplen)
	}
	if o.RingBytes == 0 {
		o.RingBytes = max(defaultRing, 4*o.Snaplen)
	}
	r := 4096
	for r < o.RingBytes && r < maxRing {
		r <<= 1
	}
	o.RingBytes = r
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// Stats counts what a capture saw and lost.
type Stats struct {
	Chunks      uint64 // ring-buffer records delivered
	LostChunks  uint64 // records the ring buffer had no room for
	LostBytes   uint64 // their data bytes
	Faults      uint64 // user buffers the kernel program could not read
	FaultBytes  uint64
	PendingFull uint64 // syscalls not recorded: too many in flight at once
	// Missed counts program runs the kernel skipped (another BPF program
	// was running on that CPU): those syscalls are not recorded.
	Missed uint64
	// InPlace counts messages written out from the ring buffer in place
	// (one record of at least 4 KiB), without a copy.
	InPlace uint64
	Tracker TrackerStats
}

// LossPercent is the share of the data bytes the kernel could not deliver
// (ring buffer full, unreadable buffers) among all data bytes seen, in
// percent; syscalls lost without a byte count (Missed, PendingFull) are
// not in it (Lost counts them).
func (s *Stats) LossPercent() float64 {
	lost := s.LostBytes + s.FaultBytes
	if lost == 0 {
		return 0
	}
	return 100 * float64(lost) / float64(lost+s.Tracker.Bytes)
}

// Lost is the number of events lost in the kernel, all causes.
func (s *Stats) Lost() uint64 { return s.LostChunks + s.Faults + s.PendingFull + s.Missed }

func (s *Stats) String() string {
	return fmt.Sprintf("%d connections (%d closed), %d messages, %d bytes; lost: %d chunks (%d bytes) ring buffer full, %d unreadable buffers (%d bytes), %d syscalls pending-map full, %d program runs missed; %d bytes marked lost in flows",
		s.Tracker.Conns, s.Tracker.Closed, s.Tracker.Messages, s.Tracker.Bytes, s.LostChunks, s.LostBytes, s.Faults, s.FaultBytes, s.PendingFull, s.Missed, s.Tracker.LostBytes)
}

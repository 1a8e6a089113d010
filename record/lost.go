package record

import (
	"fmt"
	"time"
)

// Modes that can miss bytes (kernel capture: a full ring buffer, snaplen)
// say so through these optional interfaces, which the Recordings of
// PcapSink and TextSink and the sinks themselves implement.

// LostRecorder is a Recording that can mark bytes as not captured.
type LostRecorder interface {
	// Lost records that n bytes sent in dir at about t were not captured.
	Lost(dir Dir, t time.Time, n int64)
}

// DropRecorder is a Sink that can record events lost before they reached it.
type DropRecorder interface {
	Dropped(t time.Time, n uint64, comment string)
}

// Lost records that n bytes sent in dir at about t were not captured: through
// rec's LostRecorder when it has one, else as a note on an empty Data.
func Lost(rec Recording, dir Dir, t time.Time, n int64) {
	if l, ok := rec.(LostRecorder); ok {
		l.Lost(dir, t, n)
		return
	}
	rec.Data(dir, t, nil, fmt.Sprintf("%d bytes not captured", n))
}

// Dropped records that n events were lost before they reached s, when s is a
// DropRecorder; other sinks do not record drops (the capture's own counters
// still report them).
func Dropped(s Sink, t time.Time, n uint64, comment string) {
	if d, ok := s.(DropRecorder); ok {
		d.Dropped(t, n, comment)
	}
}

// lostIface names the pcapng interface that carries drop counts.
const lostIface = "udskit capture (lost events)"

// Lost implements LostRecorder: the flow's sequence numbers skip the bytes
// (Wireshark: "previous segment not captured").
func (r *pcapRec) Lost(dir Dir, t time.Time, n int64) {
	if f := r.open(dir, nil); f != nil {
		_ = f.Lost(dir, n)
	}
}

// Dropped implements DropRecorder with an interface statistics block.
func (s *PcapSink) Dropped(t time.Time, n uint64, comment string) {
	if id, err := s.iface(lostIface); err == nil {
		_ = s.w.Dropped(id, t, n, comment)
	}
}

// Lost implements LostRecorder.
func (r *textRec) Lost(dir Dir, t time.Time, n int64) {
	r.s.event(t, r, fmt.Sprintf("%s %d bytes NOT CAPTURED", r.dirWords(dir), n), nil)
}

// Dropped implements DropRecorder.
func (s *TextSink) Dropped(t time.Time, n uint64, comment string) {
	s.event(t, &textRec{s: s, socket: lostIface}, fmt.Sprintf("LOST %d events: %s", n, comment), nil)
}

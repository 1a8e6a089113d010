package kcapture

// Message is what one syscall moved on one socket, reassembled from its
// chunks: Pieces in order, each either captured bytes or a count of bytes
// that were not captured (ring buffer full, unreadable user memory, or beyond
// the snap length).
type Message struct {
	Chunk          // header of the message (Data, Off, Covered unused)
	Pieces []Piece // cover Len bytes in total
	// hold, when not 0, says the one piece's data is the record's bytes
	// in the ring buffer (not the Assembler's): hold-1 is the ring
	// reader's id to release once the message is written.
	hold uint64
}

// Piece is a run of a message's bytes.
type Piece struct {
	Data []byte // captured bytes; nil when Lost > 0
	Lost int64  // bytes not captured
}

// LostBytes is the number of bytes of m that were not captured.
func (m *Message) LostBytes() int64 {
	var n int64
	for _, p := range m.Pieces {
		n += p.Lost
	}
	return n
}

// Assembler turns chunks into messages. Chunks of one message come from one
// thread in order (one syscall exit emits them in a loop), so a message is
// keyed by thread id and timestamp; a chunk of a new message on the same
// thread completes the previous one, whatever of it was lost. At most
// maxPartial messages are held; Flush ends them all. Not safe for concurrent
// use.
type Assembler struct {
	// Snaplen is the capture's per-syscall limit: bytes beyond it are
	// recorded as lost (truncated), not waited for.
	Snaplen uint32
	// Emit receives each complete message. Piece data is owned by the message.
	Emit func(*Message)

	partial map[uint32]*partial // by TID
	free    [][]byte            // Release'd buffers, reused newest first
}

// Buffers kept for reuse by Release: reusing memory that is still in the
// cache instead of a fresh allocation per message is most of the reader's
// speed at high rates.
const (
	maxFree    = 256
	maxFreeCap = 1 << 20
)

// buf returns an empty buffer with room for size bytes.
func (a *Assembler) buf(size int) []byte {
	if n := len(a.free); n > 0 && cap(a.free[n-1]) >= size {
		b := a.free[n-1]
		a.free = a.free[:n-1]
		return b[:0]
	}
	return make([]byte, 0, size)
}

// Release gives m's buffers back for later messages. Call it only once
// nothing holds m's data any more (the Tracker has written it: sinks copy
// what they keep, as Recording.Data's callers reuse their buffers).
func (a *Assembler) Release(m *Message) {
	if m.hold != 0 {
		m.Pieces[0].Data = nil // the ring's bytes, not a buffer of ours
		return
	}
	for i := range m.Pieces {
		if b := m.Pieces[i].Data; b != nil && cap(b) <= maxFreeCap && len(a.free) < maxFree {
			a.free = append(a.free, b)
		}
		m.Pieces[i].Data = nil
	}
}

type partial struct {
	m    Message
	next uint32 // next offset expected
	want uint32 // bytes that should arrive: min(Len, Snaplen)
}

const maxPartial = 4096

// Add consumes one chunk; c.Data is copied.
func (a *Assembler) Add(c *Chunk) {
	if a.partial == nil {
		a.partial = make(map[uint32]*partial)
	}
	p := a.partial[c.TID]
	if p != nil && (p.m.Mono != c.Mono || c.Off < p.next) {
		a.finish(c.TID, p)
		p = nil
	}
	if p == nil {
		if len(a.partial) >= maxPartial {
			for tid, q := range a.partial {
				a.finish(tid, q)
				break
			}
		}
		p = &partial{m: Message{Chunk: *c}, want: min(c.Len, a.Snaplen)}
		p.m.Data, p.m.Off, p.m.Covered = nil, 0, 0
		a.partial[c.TID] = p
	}
	if c.Off > p.next {
		p.m.Pieces = append(p.m.Pieces, Piece{Lost: int64(c.Off - p.next)})
	}
	if c.Fault() || len(c.Data) == 0 {
		if c.Covered > 0 {
			p.m.Pieces = append(p.m.Pieces, Piece{Lost: int64(c.Covered)})
		}
	} else if n := len(p.m.Pieces); n > 0 && p.m.Pieces[n-1].Lost == 0 {
		// Adjacent captured chunks (a large write, or the iovecs of a
		// writev) are one run: a datagram stays one packet.
		p.m.Pieces[n-1].Data = append(p.m.Pieces[n-1].Data, c.Data...)
	} else {
		// Room for the rest of the message at once: the chunks that follow
		// are appended without growing (and copying) the run again.
		size := len(c.Data)
		if c.Off < p.want && int(p.want-c.Off) > size {
			size = int(p.want - c.Off)
		}
		p.m.Pieces = append(p.m.Pieces, Piece{Data: append(a.buf(size), c.Data...)})
	}
	p.next = c.Off + c.Covered
	if p.next >= p.want {
		a.finish(c.TID, p)
	}
}

// Whole reports whether c is a complete message by itself: all the bytes
// its syscall moved, in one chunk, readable.
func Whole(c *Chunk) bool {
	return !c.Fault() && c.Off == 0 && c.Len > 0 && c.Covered == c.Len && uint32(len(c.Data)) == c.Len
}

// AddWhole emits the Whole chunk c as a message whose data is c.Data
// itself, not a copy: the caller keeps c.Data valid until the message is
// written, and gets hold back in Message.hold (so Release leaves it alone).
func (a *Assembler) AddWhole(c *Chunk, hold uint64) {
	if p := a.partial[c.TID]; p != nil {
		a.finish(c.TID, p)
	}
	m := &Message{Chunk: *c, Pieces: []Piece{{Data: c.Data}}, hold: hold}
	m.Data, m.Off, m.Covered = nil, 0, 0
	if a.Emit != nil {
		a.Emit(m)
	}
}

// finish emits p with whatever it misses up to Len marked lost.
func (a *Assembler) finish(tid uint32, p *partial) {
	delete(a.partial, tid)
	if p.next < p.m.Len {
		p.m.Pieces = append(p.m.Pieces, Piece{Lost: int64(p.m.Len - p.next)})
	}
	if a.Emit != nil {
		a.Emit(&p.m)
	}
}

// Flush emits every message still waiting for chunks.
func (a *Assembler) Flush() {
	for tid, p := range a.partial {
		a.finish(tid, p)
	}
}

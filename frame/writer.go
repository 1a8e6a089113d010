package frame

import (
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
)

// ErrWriterClosed is returned by a Writer after Fail or Close.
var ErrWriterClosed = errors.New("frame writer closed")

// Writer writes frames from many goroutines at once. Small frames are copied
// into a pending buffer; whichever caller finds no write in progress becomes
// the flusher and writes everything pending with one write call, so frames
// from concurrent callers are coalesced. A payload of at least LargePayload
// bytes is not copied: it goes out with writev straight from the caller's
// slice before WriteFrame returns.
//
// Callers that have to wait (a large frame behind a write in progress, or any
// frame while MaxPending bytes are queued) are served first come, first
// served: a caller that arrives later never overtakes one already waiting,
// so under load no caller starves and tail latency stays close to the median.
//
// A request or response with a large payload gets a PadKey metadata entry
// sized so that its payload starts at a multiple of Align bytes into the
// write: the kernel copies an aligned payload into and out of socket buffers
// faster (docs/performance.md, "Aligned payloads and a connection per large call").
//
// After WriteFrame returns, the caller may reuse head and payload.
type Writer struct {
	w io.Writer

	mu       sync.Mutex
	pending  []byte
	spare    []byte
	flushing bool
	queue    []*waiter // FIFO of writers waiting for their turn; queue[0] is next
	err      error
	vec      [2][]byte
	bufs     net.Buffers
	writes   uint64 // write calls completed, for Progress

	// MaxPending bounds the bytes queued behind a write in progress; callers
	// wait beyond it, so a peer that stops reading stalls only its own
	// connection's writers. Default 1 MiB.
	MaxPending int
	// LargePayload is the size from which payloads are written in place
	// instead of copied. Default DefaultLargePayload.
	LargePayload int
	// Align is the boundary a large request or response payload is padded
	// to; 0 or 1 turns padding off. Default 64, a cache line.
	Align int
	// Gather, when set and returning true, makes a caller that finds no
	// write in progress let the other runnable goroutines of the process run
	// once (runtime.Gosched) before it writes, so that the frames they are
	// about to send join its write. For streams where a write costs much
	// more than a reschedule, e.g. a *tls.Conn (a record sealed and a
	// syscall per write), and only while others are likely to write: the
	// rpc client asks whether other calls are in flight on the connection,
	// so a lone caller never waits. Called with the writer's lock held; it
	// must not block. Nil (the default): off.
	Gather func() bool
}

// waiter is one writer waiting for its turn; ch (buffered 1) wakes it.
type waiter struct{ ch chan struct{} }

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

// NewWriter returns a Writer on w. For writev, pass the *net.UnixConn or
// *net.TCPConn itself rather than a wrapper.
func NewWriter(w io.Writer) *Writer {
	// The pending buffers grow on first use: a quiet connection costs none.
	return &Writer{w: w, MaxPending: 1 << 20, LargePayload: DefaultLargePayload, Align: 64}
}

// DefaultLargePayload is Writer.LargePayload's default, 32 KiB: from this
// size a payload is written in place rather than copied, and padded.
const DefaultLargePayload = 32 << 10

// blocked reports whether a frame (large or not) must wait now. Entered with
// mu held.
func (w *Writer) blocked(large bool) bool {
	return len(w.pending) >= w.MaxPending || large && w.flushing
}

// mustWait reports whether a newly arrived frame queues. A large frame queues
// behind anyone already waiting (no overtaking); a small one only when the
// pending buffer is full, since appending it delays nobody.
func (w *Writer) mustWait(large bool) bool {
	if w.err != nil {
		return false
	}
	return w.blocked(large) || large && len(w.queue) > 0
}

// waitTurn queues the caller and returns when it is at the head of the queue
// and may proceed, or the writer has failed. Entered and left with mu held.
func (w *Writer) waitTurn(large bool) {
	wt := waiterPool.Get().(*waiter)
	w.queue = append(w.queue, wt)
	for w.err == nil && (w.queue[0] != wt || w.blocked(large)) {
		w.mu.Unlock()
		<-wt.ch
		w.mu.Lock()
	}
	if i := slices.Index(w.queue, wt); i >= 0 {
		copy(w.queue[i:], w.queue[i+1:])
		w.queue[len(w.queue)-1] = nil
		w.queue = w.queue[:len(w.queue)-1]
	}
	select { // a wake-up that raced with the check above
	case <-wt.ch:
	default:
	}
	waiterPool.Put(wt)
	// The next in line may be able to go too (a small frame while a large
	// one is being written); if not, it waits for the next flush.
	w.wakeHead()
}

// wakeHead wakes the first waiting writer, if any. Entered with mu held.
func (w *Writer) wakeHead() {
	if len(w.queue) > 0 {
		select {
		case w.queue[0].ch <- struct{}{}:
		default:
		}
	}
}

// lock takes mu for a frame (large or not), after waiting for its turn when
// it must. On a failed writer it lets mu go and returns the sticky error.
func (w *Writer) lock(large bool) error {
	w.mu.Lock()
	if w.mustWait(large) {
		w.waitTurn(large)
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	return nil
}

// WriteFrame sends one frame; it sets h.HeadLen and h.PayloadLen from head
// and payload. Errors are sticky: once a write fails, every call fails.
func (w *Writer) WriteFrame(h *Header, head, payload []byte) error {
	return w.frame(h, head, payload, modeWrite, nil)
}

// QueueFrame is WriteFrame for a caller that will call Push (or write
// again) before it waits for anything: a small frame is only appended to
// the pending buffer, so that the answers to a batch of requests read
// together go out with one write. A large payload, or a pending buffer of
// corkMax bytes or more, is written at once as by WriteFrame.
func (w *Writer) QueueFrame(h *Header, head, payload []byte) error {
	return w.frame(h, head, payload, modeQueue, nil)
}

// GatherFrame is WriteFrame for a caller that knows other goroutines are
// about to write frames on this stream (they were just handed work whose
// answer they write, e.g. the items of other bidi calls read with its own):
// when it finds no write in progress, it lets the other runnable goroutines
// of the process run once (runtime.Gosched) before it writes, so that their
// frames join its write, as Gather does for every frame. Frames that arrive
// meanwhile are appended to the pending buffer and go out with it. Only for
// small frames; a large payload is written as by WriteFrame.
func (w *Writer) GatherFrame(h *Header, head, payload []byte) error {
	_, err := w.GatherFrameYield(h, head, payload)
	return err
}

// GatherFrameYield is GatherFrame that also reports whether it let the
// others run (it found no write in progress and yielded before its write),
// for a caller that judges afterwards whether the yield gathered anything.
func (w *Writer) GatherFrameYield(h *Header, head, payload []byte) (yielded bool, err error) {
	err = w.frame(h, head, payload, modeGather, &yielded)
	return yielded, err
}

// How frame sends: at once (WriteFrame), queued (QueueFrame), or after the
// others about to write had their turn (GatherFrame).
const (
	modeWrite = iota
	modeQueue
	modeGather
)

func (w *Writer) frame(h *Header, head, payload []byte, mode int, yielded *bool) error {
	h.HeadLen = uint16(len(head))
	h.PayloadLen = uint32(len(payload))
	large := len(payload) >= w.LargePayload
	if err := w.lock(large); err != nil {
		return err
	}
	pad := 0
	if large {
		pad = w.padding(h.Type, len(head))
		h.HeadLen += uint16(pad)
	}
	w.pending = h.Append(w.pending)
	w.pending = append(w.pending, head...)
	if pad > 0 {
		w.pending = AppendPad(w.pending, pad)
	}
	if !large {
		w.pending = append(w.pending, payload...)
		if w.flushing || mode == modeQueue && len(w.pending) < corkMax {
			w.mu.Unlock()
			return nil
		}
		payload = nil
	}
	w.flushing = true
	if !large && (mode == modeGather || w.Gather != nil && w.Gather()) {
		w.mu.Unlock()
		runtime.Gosched() // frames queued meanwhile go out with this one
		w.mu.Lock()
		if yielded != nil {
			*yielded = true
		}
	}
	return w.flushLocked(payload)
}

// padding returns the size of the PadKey entry that makes a large payload
// after a head of headLen bytes start on an Align boundary of the write that
// carries it, or 0: only requests and responses have metadata heads, and the
// head must stay within MaxHead. Entered with mu held (it reads pending).
func (w *Writer) padding(t Type, headLen int) int {
	if w.Align <= 1 || t != TypeRequest && t != TypeResponse {
		return 0
	}
	end := len(w.pending) + HeaderSize + headLen + MinPad
	n := MinPad + (w.Align-end%w.Align)%w.Align
	if headLen+n > MaxHead {
		return 0
	}
	return n
}

// corkMax is how many bytes QueueFrame lets pile up before it writes.
const corkMax = 64 << 10

// Push writes whatever is pending, unless a write is in progress (whose
// writer writes it before it lets go). It does not wait.
func (w *Writer) Push() error {
	w.mu.Lock()
	if w.err != nil || w.flushing || len(w.pending) == 0 {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.flushing = true
	return w.flushLocked(nil)
}

// WriteRaw queues b as is (a hello, an NDJSON line).
func (w *Writer) WriteRaw(b []byte) error {
	if err := w.lock(false); err != nil {
		return err
	}
	w.pending = append(w.pending, b...)
	if w.flushing {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	return w.flushLocked(nil)
}

// Flush returns once every frame queued before it is written (or the writer
// has failed). Use it before closing the stream.
func (w *Writer) Flush() error {
	if err := w.lock(true); err != nil { // behind the write in progress and every waiter
		return err
	}
	if len(w.pending) == 0 {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	return w.flushLocked(nil)
}

// flushLocked is entered with mu held and flushing set; it writes until
// nothing is pending, then clears flushing and unlocks. It returns the error
// of its first write, the one that carried the caller's frame: a failure
// recorded by someone else after that write went out (a Fail from the
// reader, a later batch) is not the caller's, as for callers whose frames
// were appended to a batch in progress.
func (w *Writer) flushLocked(extra []byte) error {
	var own error
	for first := true; ; first = false {
		buf := w.pending
		w.pending = w.spare[:0]
		w.mu.Unlock()
		var err error
		if extra != nil {
			w.vec[0], w.vec[1] = buf, extra
			w.bufs = w.vec[:]
			_, err = w.bufs.WriteTo(w.w)
			w.vec[0], w.vec[1] = nil, nil
			extra = nil
		} else {
			_, err = w.w.Write(buf)
		}
		w.mu.Lock()
		w.writes++
		w.spare = buf[:0]
		if err != nil && w.err == nil {
			w.failLocked(err)
		}
		if first {
			own = err
		}
		if w.err != nil || len(w.pending) == 0 {
			w.flushing = false
			w.wakeHead()
			w.mu.Unlock()
			return own
		}
		// Still flushing: only a small frame waiting for pending room can
		// go now.
		w.wakeHead()
	}
}

// failLocked records err and wakes every waiting writer. Entered with mu held.
func (w *Writer) failLocked(err error) {
	if w.err == nil {
		w.err = err
	}
	for _, wt := range w.queue {
		select {
		case wt.ch <- struct{}{}:
		default:
		}
	}
}

// Fail makes every later write return err (ErrWriterClosed if nil) and wakes
// waiting writers. It does not close the underlying stream.
func (w *Writer) Fail(err error) {
	if err == nil {
		err = ErrWriterClosed
	}
	w.mu.Lock()
	w.failLocked(err)
	w.mu.Unlock()
}

// Err returns the sticky error, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Idle reports whether nothing is pending or being written.
func (w *Writer) Idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.flushing && len(w.pending) == 0
}

// Waiting returns how many writers are waiting for their turn.
func (w *Writer) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// Progress returns how many writes to the stream have completed and whether
// frames are waiting to go out (being written, pending, or queued). A
// caller that sees the same count with frames waiting, twice, some time
// apart, knows the peer has stopped reading.
func (w *Writer) Progress() (writes uint64, waiting bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes, w.flushing || len(w.pending) > 0 || len(w.queue) > 0
}

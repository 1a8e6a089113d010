package frame

import (
	"errors"
	"io"
	"net"
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
// After WriteFrame returns, the caller may reuse head and payload.
type Writer struct {
	w io.Writer

	mu       sync.Mutex
	cond     sync.Cond
	pending  []byte
	spare    []byte
	flushing bool
	waiters  int
	err      error
	vec      [2][]byte
	bufs     net.Buffers

	// MaxPending bounds the bytes queued behind a write in progress; callers
	// wait beyond it, so a peer that stops reading stalls only its own
	// connection's writers. Default 1 MiB.
	MaxPending int
	// LargePayload is the size from which payloads are written in place
	// instead of copied. Default 32 KiB.
	LargePayload int
}

// NewWriter returns a Writer on w. For writev, pass the *net.UnixConn or
// *net.TCPConn itself rather than a wrapper.
func NewWriter(w io.Writer) *Writer {
	fw := &Writer{w: w, MaxPending: 1 << 20, LargePayload: 32 << 10}
	fw.cond.L = &fw.mu
	fw.pending = make([]byte, 0, 16<<10)
	fw.spare = make([]byte, 0, 16<<10)
	return fw
}

// WriteFrame sends one frame; it sets h.HeadLen and h.PayloadLen from head
// and payload. Errors are sticky: once a write fails, every call fails.
func (w *Writer) WriteFrame(h *Header, head, payload []byte) error {
	h.HeadLen = uint16(len(head))
	h.PayloadLen = uint32(len(payload))
	large := len(payload) >= w.LargePayload
	w.mu.Lock()
	for w.err == nil && (len(w.pending) >= w.MaxPending || large && w.flushing) {
		w.waiters++
		w.cond.Wait()
		w.waiters--
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.pending = h.Append(w.pending)
	w.pending = append(w.pending, head...)
	if !large {
		w.pending = append(w.pending, payload...)
		if w.flushing {
			w.mu.Unlock()
			return nil
		}
		payload = nil
	}
	w.flushing = true
	return w.flushLocked(payload)
}

// WriteRaw queues b as is (a hello, an NDJSON line).
func (w *Writer) WriteRaw(b []byte) error {
	w.mu.Lock()
	for w.err == nil && len(w.pending) >= w.MaxPending {
		w.waiters++
		w.cond.Wait()
		w.waiters--
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
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

// flushLocked is entered with mu held and flushing set; it writes until
// nothing is pending, then clears flushing and unlocks.
func (w *Writer) flushLocked(extra []byte) error {
	for {
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
		w.spare = buf[:0]
		if err != nil && w.err == nil {
			w.err = err
		}
		if w.waiters > 0 {
			w.cond.Broadcast()
		}
		if w.err != nil || len(w.pending) == 0 {
			w.flushing = false
			err := w.err
			w.mu.Unlock()
			return err
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
	if w.err == nil {
		w.err = err
	}
	w.cond.Broadcast()
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

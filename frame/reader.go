package frame

import (
	"bufio"
	"errors"
	"io"
)

// Reader reads frames from a stream. It is not safe for concurrent use. The
// head returned by ReadHead is valid until the next call; payloads are read
// into buffers the caller owns.
type Reader struct {
	br   *bufio.Reader
	src  io.Reader // what br reads: large payload reads bypass br
	fill *fillCap  // br's source: src with its reads capped after a large frame
	// MaxFrame is the payload limit frames are checked against. NewReader sets
	// DefaultMaxFrame; lower it after the hello exchange.
	MaxFrame uint32
	hdr      [HeaderSize]byte
	head     []byte
	grow     int // the size Grow sets; 0 when grown
}

// NewReader returns a Reader with a read buffer of size bytes (default 64 KiB
// when size <= 0).
func NewReader(r io.Reader, size int) *Reader {
	if size <= 0 {
		size = 64 << 10
	}
	f := &fillCap{r: r}
	return &Reader{br: bufio.NewReaderSize(f, size), src: r, fill: f, MaxFrame: DefaultMaxFrame}
}

// maxFill caps a read into the buffer after a payload larger than the
// buffer. Bytes read into the buffer are copied once more on their way out,
// so when large frames come (the next is likely large too), a fill should
// bring in the next header, not the start of its payload: with the whole
// 64 KiB buffer, the first 64 KiB of every 100 KiB payload took that extra
// copy (the rest is read straight into its destination, see directMin), and
// with 16 KiB the first 16 KiB still did (2 KiB: about 2-5 µs less CPU per
// 100 KiB call, docs/performance.md, "Aligned payloads and a connection per large call"). After a frame that fits,
// fills are not capped: one read may bring in many small frames, and a cap
// would only add system calls.
const maxFill = 2 << 10

// fillCap is the buffer's source: r, with each read capped at max (0: none).
type fillCap struct {
	r   io.Reader
	max int
}

func (f *fillCap) Read(p []byte) (int, error) {
	if f.max > 0 && len(p) > f.max {
		p = p[:f.max]
	}
	return f.r.Read(p)
}

// NewSmallReader returns a Reader whose read buffer starts at small bytes
// and becomes size bytes on Grow: a server holding many quiet connections
// commits little memory for each until it is busy.
func NewSmallReader(r io.Reader, small, size int) *Reader {
	fr := NewReader(r, small)
	fr.grow = size
	return fr
}

// Grow gives a Reader made by NewSmallReader its full read buffer, if
// nothing is buffered now (it then reports true; false means try again
// later). BufReader must be called again after it.
func (r *Reader) Grow() bool {
	if r.grow == 0 {
		return true
	}
	if r.br.Buffered() > 0 {
		return false
	}
	r.br = bufio.NewReaderSize(r.fill, r.grow)
	r.grow = 0
	return true
}

// Peek returns the next n bytes without consuming them.
func (r *Reader) Peek(n int) ([]byte, error) { return r.br.Peek(n) }

// Buffered returns how many bytes can be read without touching the stream.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// BufReader exposes the underlying buffered reader (for the NDJSON mode,
// which shares the sniffed bytes).
func (r *Reader) BufReader() *bufio.Reader { return r.br }

// ReadHello reads and validates a hello.
func (r *Reader) ReadHello() (Hello, error) {
	var b [HelloSize]byte
	n, err := io.ReadFull(r.br, b[:])
	if err != nil {
		if _, perr := ParseHello(b[:n]); perr != nil && n > 0 {
			return Hello{}, perr
		}
		return Hello{}, truncated(err)
	}
	return ParseHello(b[:])
}

// ErrNotBuffered is returned by PeekFrame for a frame larger than the
// Reader's buffer: read it with ReadHeader, ReadHead and ReadPayload.
var ErrNotBuffered = errors.New("frame: frame larger than the read buffer")

// Size returns the size of the read buffer.
func (r *Reader) Size() int { return r.br.Size() }

// PeekFrame waits until the whole next frame is in the buffer and returns its
// checked header, consuming nothing; ReadHeader, ReadHead and ReadPayload then
// take the frame from the buffer without touching the stream. Because nothing
// is consumed while it waits, a PeekFrame ended by a read error (a read
// deadline set to interrupt it) can simply be called again later, by any
// goroutine, without losing the frame boundary. A frame larger than the
// buffer returns its header and ErrNotBuffered. A clean end of stream
// between frames is io.EOF; one inside a frame is a truncated ProtocolError.
func (r *Reader) PeekFrame() (Header, error) {
	b, err := r.br.Peek(HeaderSize)
	if err != nil {
		if len(b) == 0 && err == io.EOF {
			return Header{}, io.EOF
		}
		return Header{}, truncated(err)
	}
	h := ParseHeader(b)
	if err := h.Check(r.MaxFrame); err != nil {
		return Header{}, err
	}
	n := h.Size()
	if n > r.br.Size() {
		return h, ErrNotBuffered
	}
	if _, err := r.br.Peek(n); err != nil {
		return Header{}, truncated(err)
	}
	return h, nil
}

// FrameBuffered reports whether the whole next frame is in the read buffer,
// so that reading it will not touch the stream.
func (r *Reader) FrameBuffered() bool {
	n := r.br.Buffered()
	if n < HeaderSize {
		return false
	}
	b, _ := r.br.Peek(HeaderSize)
	h := ParseHeader(b)
	return n >= h.Size()
}

// ReadHeader reads and checks the next header. A clean end of stream between
// frames is io.EOF; one inside a header is a truncated ProtocolError.
func (r *Reader) ReadHeader() (Header, error) {
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		if err == io.EOF {
			return Header{}, io.EOF
		}
		return Header{}, truncated(err)
	}
	h := ParseHeader(r.hdr[:])
	if err := h.Check(r.MaxFrame); err != nil {
		return Header{}, err
	}
	return h, nil
}

// ReadHead reads h's head section and validates it for h's type. The result
// is valid until the next call on r.
func (r *Reader) ReadHead(h *Header) ([]byte, error) {
	n := int(h.HeadLen)
	if n == 0 {
		return nil, CheckHead(h, nil)
	}
	if cap(r.head) < n {
		r.head = make([]byte, 0, max(n, 512))
	}
	head := r.head[:n]
	if _, err := io.ReadFull(r.br, head); err != nil {
		return nil, truncated(err)
	}
	if err := CheckHead(h, head); err != nil {
		return nil, err
	}
	return head, nil
}

// directMin is the smallest rest of a payload (beyond what is buffered) that
// ReadPayload reads straight from the stream into the destination. Through
// the buffer, bufio copies such a rest twice (stream to buffer, buffer to
// destination) whenever it is shorter than the buffer: for a 100 KiB payload
// and a 64 KiB buffer that was a third of the payload copied once more. A
// smaller rest still goes through the buffer, whose read may bring in the
// next frame with the same system call.
const directMin = 16 << 10

// readFull fills p from the buffered bytes first and then, for a rest of
// directMin or more, straight from the stream.
func (r *Reader) readFull(p []byte) error {
	if b := r.br.Buffered(); len(p)-b >= directMin {
		if b > 0 {
			if _, err := io.ReadFull(r.br, p[:b]); err != nil { // from the buffer: no system call
				return err
			}
			p = p[b:]
		}
		if _, err := io.ReadFull(r.src, p); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		return nil
	}
	_, err := io.ReadFull(r.br, p)
	return err
}

// minGrow is the first step by which ReadPayload grows a buffer with no
// room; each later step is as large as what has arrived so far. So memory
// grows only as bytes arrive (at most about twice what was received, plus
// minGrow): a peer that announces 16 MiB and stalls costs little.
const minGrow = 32 << 10

// ReadPayload appends h's payload to dst and returns the extended slice. When
// dst has room, the bytes are read straight into it (a rest of directMin or
// more bypasses the internal buffer); otherwise dst grows step by step as
// bytes arrive.
func (r *Reader) ReadPayload(h *Header, dst []byte) ([]byte, error) {
	remaining := int(h.PayloadLen)
	if remaining > r.br.Size() {
		r.fill.max = maxFill
	} else {
		r.fill.max = 0
	}
	for remaining > 0 {
		chunk := remaining
		if avail := cap(dst) - len(dst); avail < chunk {
			// Grow only once more bytes are here: a peer that stops
			// half-way costs what it sent, not the next step too.
			if _, err := r.br.Peek(1); err != nil {
				return dst, truncated(err)
			}
			chunk = min(chunk, max(avail, len(dst), minGrow))
			dst = growExact(dst, chunk)
		}
		n := len(dst)
		if err := r.readFull(dst[n : n+chunk]); err != nil {
			return dst[:n], truncated(err)
		}
		dst = dst[:n+chunk]
		remaining -= chunk
	}
	return dst, nil
}

// growExact returns dst with room for exactly n more bytes. Not
// slices.Grow, which rounds the capacity up: a 1 MiB payload then ended in a
// buffer over 1 MiB, which callers that pool buffers up to 1 MiB drop, so
// every such call allocated its buffer again, step by step.
func growExact(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	nd := make([]byte, len(dst), len(dst)+n)
	copy(nd, dst)
	return nd
}

// Discard skips n bytes (an unknown frame's body, an abandoned call's payload).
func (r *Reader) Discard(n int) error {
	if _, err := r.br.Discard(n); err != nil {
		return truncated(err)
	}
	return nil
}

// ReadFrame reads a whole frame, its payload appended to buf. Convenience for
// tools and tests; the RPC hot path uses ReadHeader/ReadHead/ReadPayload.
func (r *Reader) ReadFrame(buf []byte) (Frame, error) {
	h, err := r.ReadHeader()
	if err != nil {
		return Frame{}, err
	}
	head, err := r.ReadHead(&h)
	if err != nil {
		return Frame{}, err
	}
	p, err := r.ReadPayload(&h, buf[:0])
	if err != nil {
		return Frame{}, err
	}
	return Frame{Header: h, Head: head, Payload: p}, nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &ProtocolError{Name: NameTruncated, Detail: "stream ended inside a frame"}
	}
	return err
}

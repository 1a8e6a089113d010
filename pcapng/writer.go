package pcapng

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Block types and option codes used here (pcapng, draft-ietf-opsawg-pcapng).
const (
	blockSHB = 0x0A0D0D0A
	blockIDB = 0x00000001
	blockISB = 0x00000005
	blockEPB = 0x00000006

	byteOrderMagic = 0x1A2B3C4D

	optEnd       = 0
	optComment   = 1
	optShbApp    = 4
	optIfName    = 2
	optIfDesc    = 3
	optIfTsresol = 9
	optEpbFlags  = 2
	optIsbIfDrop = 5
)

// LinkTypeRaw is LINKTYPE_RAW: each packet starts with an IPv4 (or IPv6) header.
const LinkTypeRaw = 101

// DefaultSnaplen is the payload bytes kept per packet when Options.Snaplen is 0.
// It is above the largest segment, so nothing is cut by default.
const DefaultSnaplen = 262144

// MaxComment caps a comment's length in bytes; longer ones are cut.
const MaxComment = 4096

// maxName caps an interface name or description.
const maxName = 1024

// Options configures a Writer. The zero value writes an unrotated stream
// that keeps every byte.
type Options struct {
	// Snaplen is how many payload bytes (bytes of the recorded stream, after
	// the synthetic IP and TCP headers, which are always kept) each packet
	// keeps; the rest is counted in the packet's original length only, as
	// with tcpdump -s. Default DefaultSnaplen.
	Snaplen int
	// Application is written as shb_userappl. Default "udskit".
	Application string
	// RotateBytes, with Rotate, starts a new output once the current one
	// holds at least this many bytes (checked after each block), like
	// tcpdump -C. Each output is a complete pcapng file: section header and
	// every interface again; flows continue in it mid-stream.
	RotateBytes int64
	// Rotate returns the n-th output (n = 1, 2, ...). When Rotate is set the
	// Writer owns its outputs: each is closed (if an io.Closer) when the next
	// one starts and at Close, the first one included. See FileRotation.
	Rotate func(n int) (io.Writer, error)
	// Async writes to the output from a background goroutine through a
	// buffer of at most AsyncBuffer bytes (default DefaultAsyncBuffer), so
	// recording overlaps with the caller's own I/O; a caller that outruns
	// the output waits for room. For files: a pipe reader would see packets
	// a moment later, so leave it off for -w -.
	Async       bool
	AsyncBuffer int
	// DropWhenFull, with Async, writes a packet without its payload (it
	// then shows as "packet size limited during capture", with a comment)
	// instead of waiting when the buffer is full: the caller is never
	// slowed by a slow disk, like tcpdump dropping packets. Dropped bytes
	// are counted (Dropped).
	DropWhenFull bool
}

// Interface is an interface's id in the capture, from AddInterface.
type Interface uint32

// ifaceInfo is kept to repeat the IDBs after a rotation.
type ifaceInfo struct{ name, desc string }

// Writer writes one pcapng stream. Create it with NewWriter.
//
// Lock invariant: mu guards everything below it, including the state of
// every Flow opened on this Writer; each block is built in buf and written
// with one Write while mu is held, so blocks never interleave.
type Writer struct {
	opts Options

	mu       sync.Mutex
	out      io.Writer
	written  int64 // bytes in the current output
	outputs  int   // outputs started (1 after NewWriter)
	err      error // first write error; sticky
	closed   bool
	ifaces   []ifaceInfo
	buf      []byte
	arena    []byte    // queued blocks' headers and trailers
	queue    []piece   // queued packet blocks
	iov      [][]byte  // flushQueue's vector
	async    *asyncOut // nil unless Options.Async
	nextPort uint16
	ipID     uint16
	flows    uint32
	packets  uint64
	cut      uint64 // payload bytes left out because the async buffer was full
}

// ErrClosed is returned by calls on a closed Writer.
var ErrClosed = errors.New("pcapng: writer closed")

// NewWriter writes the section header to out and returns the Writer.
func NewWriter(out io.Writer, opts Options) (*Writer, error) {
	if opts.Snaplen <= 0 {
		opts.Snaplen = DefaultSnaplen
	}
	if opts.Application == "" {
		opts.Application = "udskit"
	}
	w := &Writer{opts: opts, out: out, outputs: 1, nextPort: firstEphemeral}
	if opts.Async {
		if opts.AsyncBuffer <= 0 {
			opts.AsyncBuffer = DefaultAsyncBuffer
		}
		w.async = newAsync(opts.AsyncBuffer)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.writeSHB(); err != nil {
		return nil, err
	}
	return w, nil
}

// Snaplen returns the payload bytes kept per packet.
func (w *Writer) Snaplen() int { return w.opts.Snaplen }

// Packets returns how many packet blocks have been written.
func (w *Writer) Packets() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.packets
}

// PayloadDropped returns how many payload bytes were left out of the
// capture because the output could not keep up (Options.DropWhenFull).
func (w *Writer) PayloadDropped() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cut
}

// Err returns the first write error, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.async != nil {
		if err := w.async.getErr(); err != nil {
			w.err = fmt.Errorf("pcapng: write: %w", err)
		}
	}
	return w.err
}

// AddInterface declares an interface (for udskit: one socket, named by its
// path) and returns its id for FlowInfo.Interface.
func (w *Writer) AddInterface(name, description string) (Interface, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return 0, err
	}
	info := ifaceInfo{name: clip(name, maxName), desc: clip(description, maxName)}
	w.ifaces = append(w.ifaces, info)
	if err := w.writeIDB(info); err != nil {
		return 0, err
	}
	return Interface(len(w.ifaces) - 1), nil
}

// Dropped records that n events (packets, messages) on iface were lost
// before they reached the writer, as an Interface Statistics Block with
// isb_ifdrop and an optional comment.
func (w *Writer) Dropped(iface Interface, t time.Time, n uint64, comment string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	if int(iface) >= len(w.ifaces) {
		return fmt.Errorf("pcapng: unknown interface %d", iface)
	}
	b := w.begin(blockISB)
	b = binary.LittleEndian.AppendUint32(b, uint32(iface))
	b = appendTime(b, t)
	b = appendOpt(b, optComment, []byte(clip(comment, MaxComment)))
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], n)
	b = appendOpt(b, optIsbIfDrop, v[:])
	b = appendOptEnd(b)
	return w.finish(b)
}

// Close ends the stream. With Options.Rotate it closes the current output.
// Later calls return ErrClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	if w.async != nil {
		if w.opts.Rotate != nil {
			w.async.closeAfter(w.out)
		}
		if err := w.async.finish(); err != nil && w.err == nil {
			w.err = fmt.Errorf("pcapng: write: %w", err)
		}
		return w.err
	}
	if w.opts.Rotate != nil {
		if c, ok := w.out.(io.Closer); ok {
			if err := c.Close(); err != nil && w.err == nil {
				w.err = err
			}
		}
	}
	return w.err
}

func (w *Writer) usable() error {
	if w.closed {
		return ErrClosed
	}
	return w.err
}

// begin starts a block in w.buf: type and a length placeholder.
func (w *Writer) begin(typ uint32) []byte {
	b := w.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, typ)
	return binary.LittleEndian.AppendUint32(b, 0)
}

// finish writes the block (see writeBlock), then rotates the output when
// it is full.
func (w *Writer) finish(b []byte) error {
	if err := w.writeBlock(b); err != nil {
		return err
	}
	return w.maybeRotate()
}

// writeBlock fills in the block's length, appends the trailing length and
// writes the block, without the rotation check.
func (w *Writer) writeBlock(b []byte) error {
	n := uint32(len(b) + 4)
	binary.LittleEndian.PutUint32(b[4:8], n)
	b = binary.LittleEndian.AppendUint32(b, n)
	w.buf = b
	return w.write(b)
}

func (w *Writer) write(b []byte) error {
	w.iov = append(w.iov[:0], b)
	err := w.emit(w.iov)
	clear(w.iov)
	return err
}

// emit writes bufs as one unit: queued for the background writer (Async),
// or with one writev on files and pipes, else one Write of the joined bytes.
func (w *Writer) emit(bufs [][]byte) error {
	if w.err != nil {
		return w.err
	}
	var n int64
	var err error
	switch f, isFile := w.out.(*os.File); {
	case w.async != nil:
		for _, b := range bufs {
			n += int64(len(b))
		}
		err = w.async.put(w.out, bufs)
	case isFile:
		n, err = writev(f, bufs)
	default:
		b := w.buf[:0]
		for _, v := range bufs {
			b = append(b, v...)
		}
		w.buf = b
		var m int
		m, err = w.out.Write(b)
		n = int64(m)
		if err == nil && m < len(b) {
			err = io.ErrShortWrite
		}
	}
	w.written += n
	if err != nil {
		w.err = fmt.Errorf("pcapng: write: %w", err)
	}
	return w.err
}

func (w *Writer) maybeRotate() error {
	if w.opts.Rotate == nil || w.opts.RotateBytes <= 0 || w.written < w.opts.RotateBytes {
		return nil
	}
	if w.async != nil {
		w.async.closeAfter(w.out)
	} else if c, ok := w.out.(io.Closer); ok {
		if err := c.Close(); err != nil {
			w.err = fmt.Errorf("pcapng: close output %d: %w", w.outputs, err)
			return w.err
		}
	}
	next, err := w.opts.Rotate(w.outputs)
	if err != nil {
		w.err = fmt.Errorf("pcapng: rotate to output %d: %w", w.outputs+1, err)
		return w.err
	}
	w.outputs++
	w.out, w.written = next, 0
	if err := w.writeSHB(); err != nil {
		return err
	}
	for _, info := range w.ifaces {
		if err := w.writeIDB(info); err != nil {
			return err
		}
	}
	return nil
}

func (w *Writer) writeSHB() error {
	b := w.begin(blockSHB)
	b = binary.LittleEndian.AppendUint32(b, byteOrderMagic)
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, ^uint64(0)) // section length unknown
	b = appendOpt(b, optShbApp, []byte(w.opts.Application))
	b = appendOptEnd(b)
	// The SHB is written without the rotation check (it starts an output).
	return w.writeBlock(b)
}

func (w *Writer) writeIDB(info ifaceInfo) error {
	b := w.begin(blockIDB)
	b = binary.LittleEndian.AppendUint16(b, LinkTypeRaw)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(min(w.opts.Snaplen+maxHeaders, 1<<30)))
	b = appendOpt(b, optIfName, []byte(info.name))
	if info.desc != "" {
		b = appendOpt(b, optIfDesc, []byte(info.desc))
	}
	b = appendOpt(b, optIfTsresol, []byte{9})
	b = appendOptEnd(b)
	return w.writeBlock(b)
}

// piece is one queued packet block: prefix and suffix are ranges of
// w.arena, payload is the caller's bytes (not copied).
type piece struct {
	pre, suf [2]int
	payload  []byte
}

// queuePacket queues one EPB holding hdr and payload, keeping at most
// snaplen payload bytes, with an optional comment. flushQueue writes it.
func (w *Writer) queuePacket(iface Interface, t time.Time, hdr, payload []byte, comment string, drop bool) {
	kept := payload
	if len(kept) > w.opts.Snaplen {
		kept = kept[:w.opts.Snaplen]
	}
	if drop && len(kept) > 0 {
		w.cut += uint64(len(payload))
		kept = nil
		if comment == "" {
			comment = droppedNote
		} else {
			comment = droppedNote + "; " + comment
		}
	}
	capLen := len(hdr) + len(kept)
	comment = clip(comment, MaxComment)
	optLen := 0
	if comment != "" {
		optLen = 4 + (len(comment)+3)&^3 + 4
	}
	padded := (capLen + 3) &^ 3
	total := 28 + padded + optLen + 4
	a := w.arena
	p := piece{payload: kept}
	p.pre[0] = len(a)
	a = binary.LittleEndian.AppendUint32(a, blockEPB)
	a = binary.LittleEndian.AppendUint32(a, uint32(total))
	a = binary.LittleEndian.AppendUint32(a, uint32(iface))
	a = appendTime(a, t)
	a = binary.LittleEndian.AppendUint32(a, uint32(capLen))
	a = binary.LittleEndian.AppendUint32(a, uint32(len(hdr)+len(payload)))
	a = append(a, hdr...)
	p.pre[1] = len(a)
	p.suf[0] = len(a)
	a = append(a, make([]byte, padded-capLen)...)
	if comment != "" {
		a = appendOpt(a, optComment, []byte(comment))
		a = appendOptEnd(a)
	}
	a = binary.LittleEndian.AppendUint32(a, uint32(total))
	p.suf[1] = len(a)
	w.arena = a
	w.queue = append(w.queue, p)
	w.packets++
}

const droppedNote = "payload not recorded: the capture output could not keep up"

// mustDrop says whether a DropWhenFull writer leaves out a payload of n bytes.
func (w *Writer) mustDrop(n int) bool {
	return w.async != nil && w.opts.DropWhenFull && n > 0 && !w.async.room(n+n/MaxSegment*128+256)
}

// flushQueue writes the queued packet blocks: with one writev on files and
// pipes (the payloads are not copied), else with one Write; then rotates
// the output if it is full.
func (w *Writer) flushQueue() error {
	if len(w.queue) == 0 {
		return w.err
	}
	defer func() {
		w.queue, w.arena = w.queue[:0], w.arena[:0]
		clear(w.iov)
		w.iov = w.iov[:0]
	}()
	if w.err != nil {
		return w.err
	}
	for _, p := range w.queue {
		w.iov = append(w.iov, w.arena[p.pre[0]:p.pre[1]])
		if len(p.payload) > 0 {
			w.iov = append(w.iov, p.payload)
		}
		w.iov = append(w.iov, w.arena[p.suf[0]:p.suf[1]])
	}
	if err := w.emit(w.iov); err != nil {
		return err
	}
	return w.maybeRotate()
}

func appendTime(b []byte, t time.Time) []byte {
	ns := uint64(t.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, uint32(ns>>32))
	return binary.LittleEndian.AppendUint32(b, uint32(ns))
}

func appendOpt(b []byte, code uint16, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = binary.LittleEndian.AppendUint16(b, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(v)))
	b = append(b, v...)
	// Pad by the value's length: b may not start 4-aligned (the queue's
	// arena leaves the payload out).
	return append(b, make([]byte, (4-len(v)%4)%4)...)
}

func appendOptEnd(b []byte) []byte { return append(b, 0, 0, 0, 0) }

// clip cuts s to at most n bytes, on a UTF-8 boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i]
}

package record

import (
	"bufio"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// TextOptions configures a TextSink.
type TextOptions struct {
	// Hex prints a hex and ASCII dump (tcpdump -X) instead of the printable
	// bytes only (tcpdump -A).
	Hex bool
	// Snaplen caps the bytes printed per event. Default 4096; the length
	// line always gives the full count.
	Snaplen int
}

// TextSink prints a readable live view, one header line per event and the
// bytes below it. Each event is written with one Write (flushed at once).
type TextSink struct {
	opts  TextOptions
	conns atomic.Uint64

	mu  sync.Mutex // serializes events and guards out, buf, err
	out io.Writer
	buf []byte
	err error
}

// NewTextSink prints to out.
func NewTextSink(out io.Writer, opts TextOptions) *TextSink {
	if opts.Snaplen <= 0 {
		opts.Snaplen = 4096
	}
	return &TextSink{opts: opts, out: out}
}

// Err implements Sink.
func (s *TextSink) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Open implements Sink.
func (s *TextSink) Open(ci ConnInfo) Recording {
	r := &textRec{s: s, id: s.conns.Add(1), socket: ci.Socket,
		c2s: "client" + pidWords(ci.Client) + " > server" + pidWords(ci.Server),
		s2c: "server" + pidWords(ci.Server) + " > client" + pidWords(ci.Client)}
	s.event(ci.Start, r, fmt.Sprintf("open: %s", ci.Comment()), nil)
	return r
}

func (s *TextSink) event(t time.Time, r *textRec, what string, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	b := s.buf[:0]
	b = t.AppendFormat(b, "15:04:05.000000")
	b = fmt.Appendf(b, " %s #%d %s\n", r.socket, r.id, what)
	if len(p) > s.opts.Snaplen {
		p = p[:s.opts.Snaplen]
	}
	if s.opts.Hex {
		b = appendHex(b, p)
	} else {
		b = appendPrintable(b, p)
	}
	s.buf = b
	if _, err := s.out.Write(b); err != nil {
		s.err = err
	}
	if f, ok := s.out.(*bufio.Writer); ok {
		_ = f.Flush()
	}
}

type textRec struct {
	s        *TextSink
	id       uint64
	socket   string
	c2s, s2c string // "client pid 12 > server pid 34" and back
	closed   atomic.Bool
}

func pidWords(p Peer) string {
	if !p.Known {
		return ""
	}
	return fmt.Sprintf(" pid %d", p.Cred.PID)
}

func (r *textRec) dirWords(dir Dir) string {
	if dir == ClientToServer {
		return r.c2s
	}
	return r.s2c
}

func (r *textRec) Data(dir Dir, t time.Time, p []byte, note string) {
	what := fmt.Sprintf("%s %d bytes", r.dirWords(dir), len(p))
	if note != "" {
		what += " [" + note + "]"
	}
	r.s.event(t, r, what, p)
}

func (r *textRec) End(dir Dir, t time.Time) {
	r.s.event(t, r, r.dirWords(dir)+" end of data (EOF)", nil)
}

func (r *textRec) Close(reset bool, t time.Time) {
	if r.closed.Swap(true) {
		return
	}
	how := "closed"
	if reset {
		how = "closed (reset or error)"
	}
	r.s.event(t, r, how, nil)
}

// appendPrintable is tcpdump -A: printable ASCII and newlines as they are,
// every other byte as '.', indented.
func appendPrintable(b, p []byte) []byte {
	if len(p) == 0 {
		return b
	}
	b = append(b, '\t')
	for i, c := range p {
		switch {
		case c == '\n':
			b = append(b, '\n')
			if i+1 < len(p) {
				b = append(b, '\t')
			}
		case c == '\r':
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		default:
			b = append(b, '.')
		}
	}
	if b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	return b
}

// appendHex is tcpdump -X: offset, 16 bytes in hex, then as ASCII.
func appendHex(b, p []byte) []byte {
	const digits = "0123456789abcdef"
	for off := 0; off < len(p); off += 16 {
		line := p[off:min(off+16, len(p))]
		b = fmt.Appendf(b, "\t0x%04x:  ", off)
		for i := range 16 {
			if i < len(line) {
				b = append(b, digits[line[i]>>4], digits[line[i]&15])
			} else {
				b = append(b, ' ', ' ')
			}
			if i%2 == 1 {
				b = append(b, ' ')
			}
		}
		b = append(b, ' ')
		for _, c := range line {
			if c >= 0x20 && c < 0x7f {
				b = append(b, c)
			} else {
				b = append(b, '.')
			}
		}
		b = append(b, '\n')
	}
	return b
}

package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/rpc"
)

// Annotator decodes one direction of a udskit connection as its bytes go
// by, in chunks of any size, and says in words which frames begin in each
// chunk ("request id=7 method=getService", "error id=7 code=12
// unimplemented"). Memory is bounded: it keeps at most one frame head
// (frame.MaxHead) or maxNoteLine bytes of an NDJSON line. Anything it does
// not understand turns it off for the rest of the connection.
type Annotator struct {
	state   annState
	hdr     [frame.HeaderSize]byte
	have    int // bytes of hdr (or of the hello) collected
	h       frame.Header
	head    []byte // head bytes collected, up to h.HeadLen
	skip    uint64 // payload bytes still to pass
	line    []byte // NDJSON: the current line's first bytes
	lineLen int    // NDJSON: the current line's full length so far
	notes   []string
	more    int
}

type annState uint8

const (
	annStart   annState = iota // nothing seen yet
	annHello                   // collecting the 16-byte hello
	annHeader                  // collecting a frame header
	annHead                    // collecting a frame head
	annPayload                 // skipping a payload
	annNDJSON                  // newline-delimited JSON
	annOff                     // not udskit: say nothing more
)

// maxNotes caps the frames named per chunk; maxNoteLine caps the NDJSON
// bytes kept per line.
const (
	maxNotes    = 8
	maxNoteLine = 4096
)

// CodeName returns the name of a udskit error code ("code_N" when unknown),
// from rpc's table (protocol/spec.md, section 5.1). Code 0 is not an error
// code: an error frame carrying it is named "code_0".
func CodeName(c uint32) string {
	if c == 0 {
		return "code_0"
	}
	return rpc.Code(c).String()
}

// Feed takes the next chunk and returns the note for it ("" when no frame
// begins in it).
func (a *Annotator) Feed(p []byte) string {
	a.notes, a.more = a.notes[:0], 0
	for len(p) > 0 && a.state != annOff {
		switch a.state {
		case annStart:
			switch p[0] {
			case 'U':
				a.state = annHello
			case '{':
				a.state = annNDJSON
			default:
				a.state = annOff
			}
		case annHello:
			n := copy(a.hdr[a.have:], p)
			a.have += n
			p = p[n:]
			if a.have == frame.HelloSize {
				if hl, err := frame.ParseHello(a.hdr[:]); err != nil {
					a.note("bad hello")
					a.state = annOff
				} else {
					a.note(fmt.Sprintf("hello v%d flags=%#x max_frame=%d max_in_flight=%d", hl.Version, hl.Flags, hl.MaxFrame, hl.MaxInFlight))
					a.state, a.have = annHeader, 0
				}
			}
		case annHeader:
			n := copy(a.hdr[a.have:], p)
			a.have += n
			p = p[n:]
			if a.have == frame.HeaderSize {
				a.h = frame.ParseHeader(a.hdr[:])
				a.have = 0
				if a.h.HeadLen > frame.MaxHead {
					a.note("frame with an oversized head: not decoding further")
					a.state = annOff
					continue
				}
				a.head = a.head[:0]
				a.state = annHead
				if a.h.HeadLen == 0 {
					a.frameDone()
				}
			}
		case annHead:
			n := min(len(p), int(a.h.HeadLen)-len(a.head))
			a.head = append(a.head, p[:n]...)
			p = p[n:]
			if len(a.head) == int(a.h.HeadLen) {
				a.frameDone()
			}
		case annPayload:
			n := uint64(len(p))
			if n > a.skip {
				n = a.skip
			}
			a.skip -= n
			p = p[n:]
			if a.skip == 0 {
				a.state = annHeader
			}
		case annNDJSON:
			i := bytes.IndexByte(p, '\n')
			chunk := p
			if i >= 0 {
				chunk = p[:i]
			}
			if room := maxNoteLine - len(a.line); room > 0 {
				a.line = append(a.line, chunk[:min(len(chunk), room)]...)
			}
			a.lineLen += len(chunk)
			if i < 0 {
				p = nil
				continue
			}
			p = p[i+1:]
			a.note(describeLine(a.line, a.lineLen))
			a.line, a.lineLen = a.line[:0], 0
		}
	}
	if len(a.notes) == 0 {
		return ""
	}
	s := strings.Join(a.notes, "; ")
	if a.more > 0 {
		s += fmt.Sprintf("; +%d more", a.more)
	}
	return s
}

func (a *Annotator) note(s string) {
	if len(a.notes) < maxNotes {
		a.notes = append(a.notes, s)
	} else {
		a.more++
	}
}

// frameDone describes the frame whose header and head are in, then skips
// its payload.
func (a *Annotator) frameDone() {
	h := &a.h
	s := fmt.Sprintf("%s id=%d", h.Type, h.ID)
	switch h.Type {
	case frame.TypeRequest:
		if m, _, err := frame.ParseRequestHead(a.head); err == nil {
			s += fmt.Sprintf(" method=%q", m)
		} else {
			s += " (bad head)"
		}
		if h.Flags&frame.FlagStream != 0 {
			s += " stream"
		}
		if h.Flags&frame.FlagClientStream != 0 {
			s += " client_stream"
		}
		if h.Aux != 0 {
			s += fmt.Sprintf(" timeout=%dus", h.Aux)
		}
	case frame.TypeError:
		s += fmt.Sprintf(" code=%d %s %q", h.Aux, CodeName(h.Aux), clipNote(string(a.head), 200))
		if h.Flags&frame.FlagRefused != 0 {
			s += " refused"
		}
	case frame.TypeCancel:
		s += fmt.Sprintf(" reason=%d", h.Aux)
	case frame.TypeStreamCredit, frame.TypeRequestCredit:
		s += fmt.Sprintf(" credit=%d", h.Aux)
	case frame.TypeGoAway:
		s += fmt.Sprintf(" %q", clipNote(string(a.head), 200))
	}
	if h.PayloadLen > 0 {
		s += fmt.Sprintf(" payload=%d", h.PayloadLen)
	}
	a.note(s)
	a.skip = uint64(h.PayloadLen)
	a.state = annPayload
	if a.skip == 0 {
		a.state = annHeader
	}
}

// describeLine names an NDJSON request or response line.
func describeLine(line []byte, n int) string {
	if n > len(line) {
		return fmt.Sprintf("ndjson line (%d bytes)", n)
	}
	var m struct {
		ID    json.RawMessage `json:"id"`
		Func  *string         `json:"func"`
		Error *string         `json:"error"`
		Code  *string         `json:"code"`
	}
	if json.Unmarshal(line, &m) != nil {
		return fmt.Sprintf("ndjson line (%d bytes, not JSON)", n)
	}
	id := clipNote(string(m.ID), 64)
	switch {
	case m.Func != nil:
		return fmt.Sprintf("ndjson request id=%s func=%q", id, clipNote(*m.Func, 200))
	case m.Error != nil:
		code := ""
		if m.Code != nil {
			code = " code=" + clipNote(*m.Code, 64)
		}
		return fmt.Sprintf("ndjson error id=%s%s", id, code)
	}
	return fmt.Sprintf("ndjson response id=%s", id)
}

func clipNote(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package pcapng

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// MaxBlock caps the size of a block Reader accepts.
const MaxBlock = 16 << 20

// Packet is one packet block as Reader returns it.
type Packet struct {
	Interface Interface
	Time      time.Time
	Data      []byte // the captured bytes (valid until the next Next call)
	OrigLen   int
	Comment   string
}

// Reader reads the packets of a pcapng stream written by Writer (or any
// little-endian pcapng with nanosecond or microsecond timestamps). It
// checks every length against MaxBlock before reading the block. It exists
// for tests and tools; Wireshark is the real reader.
type Reader struct {
	r      io.Reader
	buf    []byte
	ifaces []ifaceRead
	// Dropped is the sum of isb_ifdrop values seen so far.
	Dropped uint64
}

type ifaceRead struct {
	Name  string
	tsDiv int64 // nanoseconds per timestamp unit
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// InterfaceName returns the if_name of interface i, or "".
func (r *Reader) InterfaceName(i Interface) string {
	if int(i) < len(r.ifaces) {
		return r.ifaces[i].Name
	}
	return ""
}

// ErrFormat is wrapped by errors about malformed input.
var ErrFormat = errors.New("pcapng: malformed")

// Next returns the next packet, or io.EOF at a clean end of input.
func (r *Reader) Next() (Packet, error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
			if err == io.ErrUnexpectedEOF {
				err = fmt.Errorf("%w: truncated block header", ErrFormat)
			}
			return Packet{}, err
		}
		typ := binary.LittleEndian.Uint32(hdr[0:])
		n := binary.LittleEndian.Uint32(hdr[4:])
		if n < 12 || n%4 != 0 || n > MaxBlock {
			return Packet{}, fmt.Errorf("%w: block length %d", ErrFormat, n)
		}
		if cap(r.buf) < int(n-8) {
			r.buf = make([]byte, n-8)
		}
		body := r.buf[:n-8]
		if _, err := io.ReadFull(r.r, body); err != nil {
			return Packet{}, fmt.Errorf("%w: truncated block: %v", ErrFormat, err)
		}
		if binary.LittleEndian.Uint32(body[len(body)-4:]) != n {
			return Packet{}, fmt.Errorf("%w: trailing length does not match", ErrFormat)
		}
		body = body[:len(body)-4]
		switch typ {
		case blockSHB:
			if len(body) < 16 || binary.LittleEndian.Uint32(body) != byteOrderMagic {
				return Packet{}, fmt.Errorf("%w: not a little-endian section header", ErrFormat)
			}
			r.ifaces = r.ifaces[:0]
		case blockIDB:
			if len(body) < 8 {
				return Packet{}, fmt.Errorf("%w: short interface block", ErrFormat)
			}
			info := ifaceRead{tsDiv: 1000}
			err := eachOpt(body[8:], func(code uint16, v []byte) error {
				switch code {
				case optIfName:
					info.Name = string(v)
				case optIfTsresol:
					if len(v) != 1 || v[0] > 9 || v[0]&0x80 != 0 {
						return fmt.Errorf("%w: unsupported if_tsresol", ErrFormat)
					}
					info.tsDiv = 1
					for range 9 - v[0] {
						info.tsDiv *= 10
					}
				}
				return nil
			})
			if err != nil {
				return Packet{}, err
			}
			if len(r.ifaces) >= 1<<16 {
				return Packet{}, fmt.Errorf("%w: too many interfaces", ErrFormat)
			}
			r.ifaces = append(r.ifaces, info)
		case blockISB:
			if len(body) < 12 {
				return Packet{}, fmt.Errorf("%w: short statistics block", ErrFormat)
			}
			err := eachOpt(body[12:], func(code uint16, v []byte) error {
				if code == optIsbIfDrop && len(v) == 8 {
					r.Dropped += binary.LittleEndian.Uint64(v)
				}
				return nil
			})
			if err != nil {
				return Packet{}, err
			}
		case blockEPB:
			if len(body) < 20 {
				return Packet{}, fmt.Errorf("%w: short packet block", ErrFormat)
			}
			id := binary.LittleEndian.Uint32(body[0:])
			if int(id) >= len(r.ifaces) {
				return Packet{}, fmt.Errorf("%w: packet on undeclared interface %d", ErrFormat, id)
			}
			ts := int64(binary.LittleEndian.Uint32(body[4:]))<<32 | int64(binary.LittleEndian.Uint32(body[8:]))
			capLen := binary.LittleEndian.Uint32(body[12:])
			orig := binary.LittleEndian.Uint32(body[16:])
			padded := (uint64(capLen) + 3) &^ 3
			if padded > uint64(len(body)-20) {
				return Packet{}, fmt.Errorf("%w: captured length %d beyond the block", ErrFormat, capLen)
			}
			p := Packet{Interface: Interface(id), Time: time.Unix(0, ts*r.ifaces[id].tsDiv),
				Data: body[20 : 20+capLen], OrigLen: int(orig)}
			err := eachOpt(body[20+padded:], func(code uint16, v []byte) error {
				if code == optComment {
					p.Comment = string(v)
				}
				return nil
			})
			if err != nil {
				return Packet{}, err
			}
			return p, nil
		}
	}
}

// eachOpt walks an options list, stopping at opt_endofopt or its end.
func eachOpt(b []byte, fn func(code uint16, v []byte) error) error {
	for len(b) >= 4 {
		code := binary.LittleEndian.Uint16(b)
		n := int(binary.LittleEndian.Uint16(b[2:]))
		if code == optEnd {
			return nil
		}
		padded := (n + 3) &^ 3
		if 4+padded > len(b) {
			return fmt.Errorf("%w: option %d overruns its block", ErrFormat, code)
		}
		if err := fn(code, b[4:4+n]); err != nil {
			return err
		}
		b = b[4+padded:]
	}
	return nil
}

package handoff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/uds"
)

// The handshake on the control socket (docs/handoff.md has the full spec).
// Every message is one frame: an 8-byte header and a body.
//
//	0   u8   type
//	1   u8   version of the frame layout (1)
//	2   u16  reserved, 0
//	4   u32  body length, big-endian, at most the type's cap
//
// OFFER frames carry the listening sockets as one SCM_RIGHTS message on the
// header's bytes; no other frame may carry descriptors.

const (
	frameVersion = 1
	headerLen    = 8

	// Protocol versions this package speaks (HELLO's range, OFFER's choice).
	minVersion = 1
	maxVersion = 1

	msgHello     = 1 // acquirer -> offerer
	msgOffer     = 2 // offerer -> acquirer, with descriptors
	msgCommit    = 3 // acquirer -> offerer
	msgCommitted = 4 // offerer -> acquirer
	msgAbort     = 5 // acquirer -> offerer
	msgError     = 6 // offerer -> acquirer

	helloMagic = "udskit-handoff"

	// MaxListeners caps the listeners one offer carries.
	MaxListeners = 32
	// MaxNameLen caps a listener's name.
	MaxNameLen = 64
	// maxAddrLen caps a listener's address (uds.MaxAddrLen).
	maxAddrLen = uds.MaxAddrLen
	// DefaultMaxState is the default cap on the state blob.
	DefaultMaxState = 1 << 20
	// HardMaxState is the largest state blob the protocol carries.
	HardMaxState = 16 << 20
	// maxTextLen caps names and messages in HELLO, ABORT and ERROR.
	maxTextLen = 1024
	// maxSmallBody caps every body except OFFER's.
	maxSmallBody = 4 + 2*maxTextLen
	// maxOfferFixed caps OFFER's body without its state blob.
	maxOfferFixed = 10 + MaxListeners*(1+MaxNameLen+1+2+maxAddrLen) + 4
)

// Error codes in ERROR frames.
const (
	codeBusy     = 1 // another acquirer holds the offer
	codeVersion  = 2 // no common protocol version
	codeProtocol = 3 // a malformed or unexpected message
	codeInternal = 4 // the offerer failed (state callback, dup)
)

// ErrBusy is returned by Acquire when another process is acquiring from the
// same offerer right now: exactly one of two concurrent acquirers wins.
var ErrBusy = errors.New("handoff: another process is taking over right now")

// ErrTLSListener is returned when a handoff would carry a tls: listener. The
// kernel socket could be passed, but not the TLS listener's accept loop:
// connections accepted and still in their TLS handshake at the commit would
// be lost, which a handoff promises never happens. The offer is refused and
// the running process serves on.
var ErrTLSListener = errors.New("handoff: a tls: listener cannot be handed off")

const tlsHandoffWhy = "a tls: listener cannot be handed off (connections in their TLS handshake at the commit would be lost); " +
	"restart it instead, or hand off a unix socket behind `udskit proxy --listen tls:...`"

// checkNotTLS refuses a Spec for a tls: listener before anything is taken.
func checkNotTLS(s Spec) error {
	if s.Listen.TLS != nil || strings.HasPrefix(s.Address, "tls:") {
		return fmt.Errorf("%w: listener %q (%s): restart it instead, or hand off a unix socket behind `udskit proxy --listen tls:...`", ErrTLSListener, s.Name, s.Address)
	}
	return nil
}

// ProtocolError is a malformed or unexpected handshake message.
type ProtocolError struct{ Reason string }

func (e *ProtocolError) Error() string { return "handoff: protocol error: " + e.Reason }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// RemoteError is an ERROR frame from the offerer.
type RemoteError struct {
	Code    uint16
	Message string
}

func (e *RemoteError) Error() string { return "handoff: offerer refused: " + e.Message }

// Is makes a busy refusal match ErrBusy.
func (e *RemoteError) Is(target error) bool { return target == ErrBusy && e.Code == codeBusy }

// ListenerInfo describes one offered listener.
type ListenerInfo struct {
	Name string   // unique within the offer, 1..MaxNameLen bytes
	Addr uds.Addr // what it is bound to (unix path, abstract name or TCP)
}

type hello struct {
	minV, maxV uint16
	who        string // the acquirer's self-description, for logs
}

type offer struct {
	version   uint16
	pid       uint32
	listeners []ListenerInfo
	state     []byte
}

// --- encoding

func appendHeader(b []byte, typ byte, bodyLen int) []byte {
	b = append(b, typ, frameVersion, 0, 0)
	return binary.BigEndian.AppendUint32(b, uint32(bodyLen))
}

func appendText16(b []byte, s string) []byte {
	if len(s) > maxTextLen {
		s = s[:maxTextLen]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func encodeHello(h hello) []byte {
	body := append([]byte(helloMagic), 0, 0, 0, 0)
	binary.BigEndian.PutUint16(body[len(helloMagic):], h.minV)
	binary.BigEndian.PutUint16(body[len(helloMagic)+2:], h.maxV)
	body = appendText16(body, h.who)
	return append(appendHeader(nil, msgHello, len(body)), body...)
}

func encodeOffer(o offer) ([]byte, error) {
	if len(o.listeners) > MaxListeners {
		return nil, fmt.Errorf("handoff: %d listeners, at most %d", len(o.listeners), MaxListeners)
	}
	if len(o.state) > HardMaxState {
		return nil, fmt.Errorf("handoff: state of %d bytes, at most %d", len(o.state), HardMaxState)
	}
	body := binary.BigEndian.AppendUint16(nil, o.version)
	body = binary.BigEndian.AppendUint32(body, o.pid)
	body = binary.BigEndian.AppendUint16(body, uint16(len(o.listeners)))
	for _, l := range o.listeners {
		addr := l.Addr.SockaddrName()
		if err := checkName(l.Name); err != nil {
			return nil, err
		}
		if len(addr) > maxAddrLen {
			return nil, fmt.Errorf("handoff: address of %q too long", l.Name)
		}
		body = append(body, byte(len(l.Name)))
		body = append(body, l.Name...)
		body = append(body, byte(l.Addr.Kind))
		body = binary.BigEndian.AppendUint16(body, uint16(len(addr)))
		body = append(body, addr...)
	}
	body = binary.BigEndian.AppendUint32(body, uint32(len(o.state)))
	body = append(body, o.state...)
	return append(appendHeader(nil, msgOffer, len(body)), body...), nil
}

func encodeText(typ byte, code uint16, msg string) []byte {
	body := appendText16(binary.BigEndian.AppendUint16(nil, code), msg)
	return append(appendHeader(nil, typ, len(body)), body...)
}

func encodeEmpty(typ byte) []byte { return appendHeader(nil, typ, 0) }

func checkName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("handoff: listener name %q: want 1 to %d bytes", name, MaxNameLen)
	}
	return nil
}

// --- decoding: every length is checked against the bytes present and its cap.

// bodyCap is the largest body a frame of typ may have; maxState is the
// receiver's cap on OFFER's state blob.
func bodyCap(typ byte, maxState int) (int, error) {
	switch typ {
	case msgOffer:
		return maxOfferFixed + maxState, nil
	case msgHello, msgAbort, msgError:
		return len(helloMagic) + maxSmallBody, nil
	case msgCommit, msgCommitted:
		return 0, nil
	}
	return 0, protoErr("unknown message type %d", typ)
}

func parseHeader(h []byte, maxState int) (typ byte, n int, err error) {
	typ = h[0]
	if h[1] != frameVersion {
		return 0, 0, protoErr("frame version %d, want %d", h[1], frameVersion)
	}
	if h[2] != 0 || h[3] != 0 {
		return 0, 0, protoErr("reserved header bytes are not zero")
	}
	limit, err := bodyCap(typ, maxState)
	if err != nil {
		return 0, 0, err
	}
	n64 := binary.BigEndian.Uint32(h[4:])
	if uint64(n64) > uint64(limit) {
		return 0, 0, protoErr("message type %d of %d bytes, over its %d-byte cap", typ, n64, limit)
	}
	return typ, int(n64), nil
}

type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) done(what string) error {
	if r.bad {
		return protoErr("%s: truncated or a length runs past the end", what)
	}
	if len(r.b) != 0 {
		return protoErr("%s: %d trailing bytes", what, len(r.b))
	}
	return nil
}

func decodeHello(body []byte) (hello, error) {
	r := reader{b: body}
	if string(r.take(len(helloMagic))) != helloMagic {
		return hello{}, protoErr("not a handoff client (bad magic)")
	}
	h := hello{minV: r.u16(), maxV: r.u16()}
	n := r.u16()
	if int(n) > maxTextLen {
		return hello{}, protoErr("hello: name of %d bytes", n)
	}
	h.who = string(r.take(int(n)))
	if err := r.done("hello"); err != nil {
		return hello{}, err
	}
	if h.minV > h.maxV {
		return hello{}, protoErr("hello: version range %d..%d is empty", h.minV, h.maxV)
	}
	return h, nil
}

func decodeOffer(body []byte, nfds, maxState int) (offer, error) {
	r := reader{b: body}
	o := offer{version: r.u16(), pid: r.u32()}
	n := int(r.u16())
	if n > MaxListeners {
		return offer{}, protoErr("offer: %d listeners, at most %d", n, MaxListeners)
	}
	if n != nfds {
		return offer{}, protoErr("offer: %d listeners but %d descriptors", n, nfds)
	}
	seen := map[string]bool{}
	for range n {
		name := string(r.take(int(r.u8())))
		kind := uds.Kind(r.u8())
		addr := string(r.take(int(r.u16())))
		if r.bad {
			break
		}
		if err := checkName(name); err != nil {
			return offer{}, protoErr("offer: %v", err)
		}
		if seen[name] {
			return offer{}, protoErr("offer: listener name %q twice", name)
		}
		seen[name] = true
		a, err := decodeAddr(kind, addr)
		if err != nil {
			return offer{}, protoErr("offer: listener %q: %v", name, err)
		}
		o.listeners = append(o.listeners, ListenerInfo{Name: name, Addr: a})
	}
	sl := r.u32()
	if uint64(sl) > uint64(maxState) {
		return offer{}, protoErr("offer: state of %d bytes, over the %d-byte cap", sl, maxState)
	}
	o.state = r.take(int(sl))
	if err := r.done("offer"); err != nil {
		return offer{}, err
	}
	return o, nil
}

func decodeAddr(kind uds.Kind, s string) (uds.Addr, error) {
	if s == "" || len(s) > maxAddrLen {
		return uds.Addr{}, errors.New("empty or too long address")
	}
	switch kind {
	case uds.Unix:
		return uds.Addr{Kind: uds.Unix, Name: s}, nil
	case uds.Abstract:
		if s[0] != '@' || len(s) == 1 {
			return uds.Addr{}, errors.New("abstract name without '@'")
		}
		return uds.Addr{Kind: uds.Abstract, Name: s[1:]}, nil
	case uds.TCP:
		if _, _, err := net.SplitHostPort(s); err != nil {
			return uds.Addr{}, err
		}
		return uds.Addr{Kind: uds.TCP, Name: s}, nil
	}
	return uds.Addr{}, fmt.Errorf("unknown listener kind %d", kind)
}

func decodeText(body []byte) (code uint16, msg string, err error) {
	r := reader{b: body}
	code = r.u16()
	n := r.u16()
	if int(n) > maxTextLen {
		return 0, "", protoErr("text of %d bytes", n)
	}
	msg = string(r.take(int(n)))
	return code, msg, r.done("text")
}

// --- frames on a connection

// writeFrame writes one encoded frame, with fds on it when there are any.
func writeFrame(c *net.UnixConn, frame []byte, fds []int) error {
	if len(fds) > 0 {
		return uds.SendFDs(c, frame, fds)
	}
	_, err := c.Write(frame)
	return err
}

// readFrame reads one frame. Descriptors are accepted only with OFFER and
// only when wantFDs; any others are closed and make it a protocol error.
// The caller owns the returned fds.
func readFrame(c *net.UnixConn, maxState int, wantFDs bool) (typ byte, body []byte, fds []int, err error) {
	var h [headerLen]byte
	got := 0
	limit := 0
	if wantFDs {
		limit = MaxListeners
	}
	defer func() {
		if err != nil {
			closeFDs(fds)
			fds = nil
		}
	}()
	for got < headerLen {
		n, more, err := uds.RecvFDs(c, h[got:], limit)
		fds = append(fds, more...)
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, fds, err
		}
		got += n
	}
	typ, n, err := parseHeader(h[:], maxState)
	if err != nil {
		return 0, nil, fds, err
	}
	if len(fds) > 0 && typ != msgOffer {
		return 0, nil, fds, protoErr("descriptors on a message of type %d", typ)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fds, err
	}
	return typ, body, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

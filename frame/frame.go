package frame

import (
	"encoding/binary"
	"fmt"
)

// Wire constants. See protocol/spec.md.
const (
	// HeaderSize is the size of every frame header.
	HeaderSize = 16
	// HelloSize is the size of the hello each side sends first.
	HelloSize = 16
	// Version is the protocol version this package speaks.
	Version = 1
	// DefaultMaxFrame is the default limit on a frame's payload length (16 MiB).
	DefaultMaxFrame = 16 << 20
	// MinMaxFrame is the smallest max-frame a hello may announce.
	MinMaxFrame = 1024
	// MaxHead is the fixed limit on a frame's head section (method + metadata,
	// or an error message): 16 KiB.
	MaxHead = 16 << 10
	// DefaultMaxInFlight is the default limit on concurrent calls per connection.
	DefaultMaxInFlight = 4096
)

// Magic opens every udskit connection. Its first byte, 'U', tells it apart from
// a newline-JSON client ('{') and an HTTP/2 preface ('P').
var Magic = [4]byte{'U', 'D', 'S', 'K'}

// Type is a frame type.
type Type uint8

// Frame types.
const (
	TypeRequest    Type = 1 // client→server: start a call
	TypeResponse   Type = 2 // server→client: unary result
	TypeError      Type = 3 // server→client: call failed (id 0: connection failed)
	TypeCancel     Type = 4 // client→server: abandon a call
	TypeStreamData Type = 5 // server→client: one item of a server stream
	TypeStreamEnd  Type = 6 // server→client: server stream finished successfully
	TypePing       Type = 7 // either way: liveness probe
	TypePong       Type = 8 // either way: answer to a ping
	TypeGoAway     Type = 9 // server→client: draining, send no new requests
	// TypeStreamCredit (client→server) lets the server send aux more bytes
	// of stream items on call id; used only when both hellos set
	// FeatureStreamCredit (protocol/spec.md, section 4.1).
	TypeStreamCredit Type = 10
	// TypeRequestData (client→server) carries one request item of a call
	// opened with FlagClientStream (protocol/spec.md, section 4.3).
	TypeRequestData Type = 11
	// TypeRequestEnd (client→server): no more request items on this call
	// (the client's half-close of one call).
	TypeRequestEnd Type = 12
	// TypeRequestCredit (server→client) lets the client send aux more bytes
	// of request items on call id.
	TypeRequestCredit Type = 13
)

var typeNames = [...]string{"", "request", "response", "error", "cancel", "stream_data", "stream_end", "ping", "pong", "goaway", "stream_credit",
	"request_data", "request_end", "request_credit"}

func (t Type) String() string {
	if t.Known() {
		return typeNames[t]
	}
	return fmt.Sprintf("type_%d", uint8(t))
}

// Known reports whether t is a frame type of this version. Unknown types are
// skipped by receivers.
func (t Type) Known() bool { return t >= TypeRequest && t <= TypeRequestCredit }

// FromClient reports whether a client may send frames of type t; a server
// receiving a known type for which it is false has a wrong-direction frame,
// a connection error (protocol/spec.md, section 3). Ping and pong go either
// way; unknown types are neither checked nor refused (they are skipped).
func (t Type) FromClient() bool {
	switch t {
	case TypeRequest, TypeCancel, TypePing, TypePong, TypeStreamCredit, TypeRequestData, TypeRequestEnd:
		return true
	}
	return !t.Known()
}

// FromServer reports whether a server may send frames of type t (see
// FromClient).
func (t Type) FromServer() bool {
	switch t {
	case TypeResponse, TypeError, TypeStreamData, TypeStreamEnd, TypePing, TypePong, TypeGoAway, TypeRequestCredit:
		return true
	}
	return !t.Known()
}

// Frame flags.
const (
	// FlagStream on a request: the caller expects a server stream.
	FlagStream uint8 = 1 << 0
	// FlagRefused on an error: the request was not processed at all, so it is
	// safe to send again (on another connection).
	FlagRefused uint8 = 1 << 0
	// FlagClientStream on a request: the call carries request items from
	// the client (request_data, request_end); with FlagStream it is a
	// bidirectional call, alone a client-streaming one (protocol/spec.md,
	// section 4.3). The request's own payload is then empty.
	FlagClientStream uint8 = 1 << 1
)

// Hello feature flags; a feature is used only when both hellos set it.
const (
	// FeatureStreamCredit: server streams are flow-controlled with
	// stream_credit frames (protocol/spec.md, section 4.1).
	FeatureStreamCredit uint8 = 1 << 0
	// FeatureClientStream: the sender implements client-streaming and
	// bidirectional calls (protocol/spec.md, section 4.3). A client opens
	// such a call only when the server's hello sets it.
	FeatureClientStream uint8 = 1 << 1
)

// InitialStreamCredit is the credit, in payload bytes, each server stream
// starts with when FeatureStreamCredit is in use.
const InitialStreamCredit = 1 << 20

// InitialRequestCredit is the credit, in bytes (payload + HeaderSize per
// item), each client-stream call starts with on the client.
const InitialRequestCredit = 1 << 20

// Header is a decoded frame header.
//
//	offset size field
//	0      1    type
//	1      1    flags
//	2      2    head length (bytes after the header, before the payload)
//	4      4    id (call id; 0 for connection-level frames)
//	8      4    payload length
//	12     4    aux (request: timeout in microseconds, 0 = none;
//	            error: code; ping/pong: opaque; otherwise 0)
type Header struct {
	Type       Type
	Flags      uint8
	HeadLen    uint16
	ID         uint32
	PayloadLen uint32
	Aux        uint32
}

// Put encodes h into b[:HeaderSize].
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = byte(h.Type)
	b[1] = h.Flags
	binary.LittleEndian.PutUint16(b[2:], h.HeadLen)
	binary.LittleEndian.PutUint32(b[4:], h.ID)
	binary.LittleEndian.PutUint32(b[8:], h.PayloadLen)
	binary.LittleEndian.PutUint32(b[12:], h.Aux)
}

// Append appends the encoded header to b.
func (h *Header) Append(b []byte) []byte {
	var a [HeaderSize]byte
	h.Put(a[:])
	return append(b, a[:]...)
}

// Size is the frame's length on the wire: header, head and payload.
func (h *Header) Size() int { return HeaderSize + int(h.HeadLen) + int(h.PayloadLen) }

// ParseHeader decodes b[:HeaderSize]. It does not validate; see Check.
func ParseHeader(b []byte) Header {
	_ = b[HeaderSize-1]
	return Header{
		Type:       Type(b[0]),
		Flags:      b[1],
		HeadLen:    binary.LittleEndian.Uint16(b[2:]),
		ID:         binary.LittleEndian.Uint32(b[4:]),
		PayloadLen: binary.LittleEndian.Uint32(b[8:]),
		Aux:        binary.LittleEndian.Uint32(b[12:]),
	}
}

// Check validates the header's lengths and id against maxFrame (the
// negotiated payload limit), before anything is read or allocated for it.
func (h *Header) Check(maxFrame uint32) error {
	if h.PayloadLen > maxFrame {
		return protoErr(NameFrameTooLarge, "payload length %d over the limit %d", h.PayloadLen, maxFrame)
	}
	if h.HeadLen > MaxHead {
		return protoErr(NameHeadTooLarge, "head length %d over the limit %d", h.HeadLen, MaxHead)
	}
	switch h.Type {
	case TypeRequest, TypeResponse, TypeCancel, TypeStreamData, TypeStreamEnd, TypeStreamCredit,
		TypeRequestData, TypeRequestEnd, TypeRequestCredit:
		if h.ID == 0 {
			return protoErr(NameBadID, "%s frame with id 0", h.Type)
		}
	case TypePing, TypePong, TypeGoAway:
		if h.ID != 0 {
			return protoErr(NameBadID, "%s frame with id %d, want 0", h.Type, h.ID)
		}
	case TypeError:
		if h.Aux == 0 {
			return protoErr(NameBadCode, "error frame with code 0")
		}
	}
	return nil
}

// Hello is the first thing each side sends:
//
//	offset size field
//	0      4    magic "UDSK"
//	4      1    version
//	5      1    feature flags (FeatureStreamCredit, FeatureClientStream;
//	            unknown ones are ignored)
//	6      2    reserved, 0 (ignored)
//	8      4    max frame: the largest payload this side accepts
//	12     4    max in-flight: the most concurrent calls this side accepts
//	            (a client sends 0: it accepts whatever it asked for)
type Hello struct {
	Version     uint8
	Flags       uint8
	MaxFrame    uint32
	MaxInFlight uint32
}

// Put encodes h into b[:HelloSize].
func (h *Hello) Put(b []byte) {
	_ = b[HelloSize-1]
	copy(b, Magic[:])
	b[4] = h.Version
	b[5] = h.Flags
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint32(b[8:], h.MaxFrame)
	binary.LittleEndian.PutUint32(b[12:], h.MaxInFlight)
}

// ParseHello decodes and validates a hello.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < HelloSize {
		if len(b) > 0 && b[0] != Magic[0] || len(b) > 1 && b[1] != Magic[1] ||
			len(b) > 2 && b[2] != Magic[2] || len(b) > 3 && b[3] != Magic[3] {
			return Hello{}, protoErr(NameBadMagic, "hello does not start with %q", Magic[:])
		}
		return Hello{}, protoErr(NameTruncated, "hello is %d bytes, want %d", len(b), HelloSize)
	}
	if [4]byte(b[:4]) != Magic {
		return Hello{}, protoErr(NameBadMagic, "hello starts with %q, want %q", b[:4], Magic[:])
	}
	h := Hello{
		Version:     b[4],
		Flags:       b[5],
		MaxFrame:    binary.LittleEndian.Uint32(b[8:]),
		MaxInFlight: binary.LittleEndian.Uint32(b[12:]),
	}
	if h.Version == 0 {
		return Hello{}, protoErr(NameBadVersion, "version 0")
	}
	if h.MaxFrame < MinMaxFrame {
		return Hello{}, protoErr(NameBadLimits, "max frame %d under the minimum %d", h.MaxFrame, MinMaxFrame)
	}
	return h, nil
}

// Negotiate returns the limits both sides use on a connection: the smaller
// max frame, the server's max in-flight, and the smaller version. It fails
// with bad_version when the agreed version is not one this package speaks.
func Negotiate(client, server Hello) (version uint8, maxFrame, maxInFlight uint32, err error) {
	version = min(client.Version, server.Version)
	if version != Version {
		return 0, 0, 0, protoErr(NameBadVersion, "no common version (client %d, server %d)", client.Version, server.Version)
	}
	return version, min(client.MaxFrame, server.MaxFrame), server.MaxInFlight, nil
}

// Features returns the hello feature flags in use on a connection: those
// both sides set.
func Features(client, server Hello) uint8 { return client.Flags & server.Flags }

package frame

import "encoding/binary"

// A request's head is the method name followed by metadata entries:
//
//	u16 method length, method bytes (1..MaxHead),
//	then zero or more entries: u16 key length (>0), key, u16 value length, value.
//
// A response's or stream end's head is zero or more metadata entries. An
// error's or goaway's head is a UTF-8 message. All lengths are little-endian.

// AppendRequestHead appends a request head for method and the metadata pairs
// kv (key, value, key, value, ...) to b.
func AppendRequestHead(b []byte, method string, kv ...string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(method)))
	b = append(b, method...)
	return AppendMetadata(b, kv...)
}

// AppendMetadata appends metadata entries for the pairs kv to b. An odd
// trailing key gets an empty value.
func AppendMetadata(b []byte, kv ...string) []byte {
	for i := 0; i < len(kv); i += 2 {
		v := ""
		if i+1 < len(kv) {
			v = kv[i+1]
		}
		b = AppendMD(b, kv[i], v)
	}
	return b
}

// AppendMD appends one metadata entry.
func AppendMD(b []byte, key, value string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(value)))
	return append(b, value...)
}

// Reserved metadata keys (spec 3.1) start with ':' and belong to the
// protocol: receivers hide them from applications, and senders refuse them
// from applications.
const (
	ReservedPrefix = ':'
	// PadKey is the padding entry a sender may add, last in a request's or
	// response's head, so that the payload starts on an aligned offset.
	PadKey = ":pad"
	// MinPad is the size of the smallest PadKey entry (empty value).
	MinPad = 2 + len(PadKey) + 2
)

// Reserved reports whether key is reserved for the protocol.
func Reserved(key string) bool { return len(key) > 0 && key[0] == ReservedPrefix }

// AppendPad appends one PadKey entry of exactly n bytes (n >= MinPad) whose
// value is zeros.
func AppendPad(b []byte, n int) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(PadKey)))
	b = append(b, PadKey...)
	b = binary.LittleEndian.AppendUint16(b, uint16(n-MinPad))
	return append(b, make([]byte, n-MinPad)...)
}

// RangeAppMetadata is RangeMetadata for what an application sees: reserved
// keys are skipped.
func RangeAppMetadata(md []byte, fn func(key, value []byte) bool) error {
	return RangeMetadata(md, func(k, v []byte) bool {
		return k[0] == ReservedPrefix || fn(k, v)
	})
}

// HasAppMetadata reports whether the metadata md has an entry an application
// sees (one whose key is not reserved). A receiver that keeps a head's
// metadata past the read buffer can skip the copy when it has none: a large
// payload's PadKey entry alone is not worth one.
func HasAppMetadata(md []byte) bool {
	has := false
	_ = RangeAppMetadata(md, func(_, _ []byte) bool { has = true; return false })
	return has
}

// ParseRequestHead splits a request head into the method and the raw metadata
// entries, validating both. The results alias head.
func ParseRequestHead(head []byte) (method, md []byte, err error) {
	if len(head) < 2 {
		return nil, nil, protoErr(NameBadHead, "request head is %d bytes, no method length", len(head))
	}
	n := int(binary.LittleEndian.Uint16(head))
	if n == 0 {
		return nil, nil, protoErr(NameBadHead, "empty method name")
	}
	if 2+n > len(head) {
		return nil, nil, protoErr(NameBadHead, "method length %d overruns the %d-byte head", n, len(head))
	}
	method, md = head[2:2+n], head[2+n:]
	if err := CheckMetadata(md); err != nil {
		return nil, nil, err
	}
	return method, md, nil
}

// CheckMetadata validates raw metadata entries.
func CheckMetadata(md []byte) error {
	return RangeMetadata(md, func(_, _ []byte) bool { return true })
}

// RangeMetadata calls fn for each entry of raw metadata until fn returns
// false. Keys and values alias md.
func RangeMetadata(md []byte, fn func(key, value []byte) bool) error {
	for len(md) > 0 {
		if len(md) < 2 {
			return protoErr(NameBadHead, "metadata entry cut short")
		}
		kl := int(binary.LittleEndian.Uint16(md))
		if kl == 0 {
			return protoErr(NameBadHead, "empty metadata key")
		}
		if 2+kl+2 > len(md) {
			return protoErr(NameBadHead, "metadata key length %d overruns the head", kl)
		}
		key := md[2 : 2+kl]
		md = md[2+kl:]
		vl := int(binary.LittleEndian.Uint16(md))
		if 2+vl > len(md) {
			return protoErr(NameBadHead, "metadata value length %d overruns the head", vl)
		}
		val := md[2 : 2+vl]
		md = md[2+vl:]
		if !fn(key, val) {
			return nil
		}
	}
	return nil
}

// Frame is a whole decoded frame. Head and Payload alias the decoded input.
type Frame struct {
	Header
	Head    []byte
	Payload []byte
}

// Decode decodes one frame from the start of b, checking it against maxFrame,
// and returns it with the number of bytes it took. It fails with truncated
// when b holds less than a whole frame, and never reads past the frame.
func Decode(b []byte, maxFrame uint32) (Frame, int, error) {
	if len(b) < HeaderSize {
		return Frame{}, 0, protoErr(NameTruncated, "%d bytes, a header is %d", len(b), HeaderSize)
	}
	h := ParseHeader(b)
	if err := h.Check(maxFrame); err != nil {
		return Frame{}, 0, err
	}
	n := h.Size()
	if len(b) < n {
		return Frame{}, 0, protoErr(NameTruncated, "frame needs %d bytes, have %d", n, len(b))
	}
	f := Frame{Header: h, Head: b[HeaderSize : HeaderSize+int(h.HeadLen)], Payload: b[HeaderSize+int(h.HeadLen) : n]}
	if err := CheckHead(&f.Header, f.Head); err != nil {
		return Frame{}, 0, err
	}
	return f, n, nil
}

// CheckHead validates a frame's head section for its type.
func CheckHead(h *Header, head []byte) error {
	switch h.Type {
	case TypeRequest:
		_, _, err := ParseRequestHead(head)
		return err
	case TypeResponse, TypeStreamEnd:
		return CheckMetadata(head)
	}
	return nil
}

package shm

import (
	"encoding/binary"
	"fmt"
)

// Wire constants of protocol/spec.md, section 10.
const (
	// FeatureShm is the hello feature flag (bit 2).
	FeatureShm uint8 = 1 << 2
	// FlagShm on a request, response or stream_data frame: the payload is
	// a descriptor (DescSize bytes) of a slot in the region.
	FlagShm uint8 = 1 << 2
	// TypeOffer (client → server, first frame after the hellos) carries the
	// region's size; the memfd comes with it as SCM_RIGHTS.
	TypeOffer uint8 = 14
	// TypeRelease (either way) returns slots to their writer.
	TypeRelease uint8 = 15

	DescSize  = 8
	OfferSize = 16 + 8 // header + u64 size

	MinRegion      = 128 << 10
	MaxRegion      = 1 << 30
	RegionMultiple = 64 << 10

	// MaxReleaseEntries bounds one shm_release frame.
	MaxReleaseEntries = 2048

	// DefaultRegion is the size Go clients offer: 32 MiB per direction,
	// so any payload up to the default max frame (16 MiB) fits.
	DefaultRegion = 64 << 20
	// DefaultThreshold is the payload size from which Go puts a payload in
	// the region; smaller ones stay in the frame.
	DefaultThreshold = 16 << 10
)

// Error names (protocol/vectors/shm.json); each is a connection error
// protocol_violation.
const (
	NameBadOffer   = "bad_offer"
	NameBadDesc    = "bad_desc"
	NameBadRelease = "bad_release"
)

// Error is a peer's violation of section 10.
type Error struct {
	Name   string
	Detail string
}

func (e *Error) Error() string { return "udskit shm: " + e.Name + ": " + e.Detail }

func errf(name, format string, args ...any) *Error {
	return &Error{Name: name, Detail: fmt.Sprintf(format, args...)}
}

// Desc is a slot: Len bytes at Off, from the start of the region.
type Desc struct {
	Off, Len uint32
}

// End is the slot's end offset, in 64 bits (no overflow).
func (d Desc) End() uint64 { return uint64(d.Off) + uint64(d.Len) }

// Put writes d's 8 bytes to b.
func (d Desc) Put(b []byte) {
	binary.LittleEndian.PutUint32(b, d.Off)
	binary.LittleEndian.PutUint32(b[4:], d.Len)
}

// ParseDesc decodes a descriptor payload; it must be exactly DescSize bytes.
// Bounds are Tracker's business.
func ParseDesc(b []byte) (Desc, error) {
	if len(b) != DescSize {
		return Desc{}, errf(NameBadDesc, "descriptor payload of %d bytes, want %d", len(b), DescSize)
	}
	return Desc{Off: binary.LittleEndian.Uint32(b), Len: binary.LittleEndian.Uint32(b[4:])}, nil
}

// AppendOffer appends a shm_offer frame for a region of size bytes.
func AppendOffer(b []byte, size uint64) []byte {
	var f [OfferSize]byte
	f[0] = TypeOffer
	binary.LittleEndian.PutUint32(f[8:], 8)
	binary.LittleEndian.PutUint64(f[16:], size)
	return append(b, f[:]...)
}

// ParseOffer checks one whole shm_offer frame (OfferSize bytes: the server
// reads exactly that many) and returns the region size it announces.
func ParseOffer(f []byte) (uint64, error) {
	if len(f) != OfferSize {
		return 0, errf(NameBadOffer, "offer of %d bytes, want %d", len(f), OfferSize)
	}
	typ, headLen := f[0], binary.LittleEndian.Uint16(f[2:])
	id, plen := binary.LittleEndian.Uint32(f[4:]), binary.LittleEndian.Uint32(f[8:])
	switch {
	case typ != TypeOffer:
		return 0, errf(NameBadOffer, "the first frame after the hellos is type %d, not shm_offer (14)", typ)
	case headLen != 0 || plen != 8 || id != 0:
		return 0, errf(NameBadOffer, "shm_offer with head length %d, payload length %d, id %d (want 0, 8, 0)", headLen, plen, id)
	}
	size := binary.LittleEndian.Uint64(f[16:])
	if err := CheckSize(size); err != nil {
		return 0, err
	}
	return size, nil
}

// CheckSize reports whether size is a valid region size.
func CheckSize(size uint64) error {
	if size < MinRegion || size > MaxRegion || size%RegionMultiple != 0 {
		return errf(NameBadOffer, "region size %d: want a multiple of %d from %d to %d", size, RegionMultiple, MinRegion, MaxRegion)
	}
	return nil
}

// Halves returns the client half [0, S/2) and server half [S/2, S) bounds.
func Halves(size uint64) (client, server [2]uint64) {
	return [2]uint64{0, size / 2}, [2]uint64{size / 2, size}
}

// ParseRelease checks a shm_release frame's id, head and payload shape and
// calls each for every entry in order, stopping at its first error.
func ParseRelease(id uint32, headLen int, payload []byte, each func(Desc) error) error {
	n := len(payload) / DescSize
	switch {
	case id != 0 || headLen != 0:
		return errf(NameBadRelease, "shm_release with id %d and head length %d (want 0, 0)", id, headLen)
	case len(payload) == 0 || len(payload)%DescSize != 0:
		return errf(NameBadRelease, "shm_release payload of %d bytes: want a non-zero multiple of 8", len(payload))
	case n > MaxReleaseEntries:
		return errf(NameBadRelease, "shm_release of %d entries, over %d", n, MaxReleaseEntries)
	}
	for i := 0; i < n; i++ {
		d := Desc{Off: binary.LittleEndian.Uint32(payload[i*8:]), Len: binary.LittleEndian.Uint32(payload[i*8+4:])}
		if err := each(d); err != nil {
			return err
		}
	}
	return nil
}

// AppendRelease appends a shm_release frame naming ds.
func AppendRelease(b []byte, ds ...Desc) []byte {
	var h [16]byte
	h[0] = TypeRelease
	binary.LittleEndian.PutUint32(h[8:], uint32(len(ds)*DescSize))
	b = append(b, h[:]...)
	for _, d := range ds {
		var e [8]byte
		d.Put(e[:])
		b = append(b, e[:]...)
	}
	return b
}

// AnswerSize is the server's answer to an offer: a bare header.
const AnswerSize = 16

// AppendAnswer appends the server's answer: accepted (aux 1) or declined (0).
func AppendAnswer(b []byte, accepted bool) []byte {
	var f [AnswerSize]byte
	f[0] = TypeOffer
	if accepted {
		f[12] = 1
	}
	return append(b, f[:]...)
}

// ParseAnswer checks the server's answer (the 16 bytes a client reads after
// the server's hello) and reports whether it accepted.
func ParseAnswer(f []byte) (bool, error) {
	if len(f) != AnswerSize {
		return false, errf(NameBadOffer, "answer of %d bytes, want %d", len(f), AnswerSize)
	}
	typ, headLen := f[0], binary.LittleEndian.Uint16(f[2:])
	id, plen, aux := binary.LittleEndian.Uint32(f[4:]), binary.LittleEndian.Uint32(f[8:]), binary.LittleEndian.Uint32(f[12:])
	switch {
	case typ != TypeOffer:
		return false, errf(NameBadOffer, "the server's first frame after its hello is type %d, not its shm_offer answer (14)", typ)
	case headLen != 0 || plen != 0 || id != 0 || aux > 1:
		return false, errf(NameBadOffer, "shm_offer answer with head length %d, payload length %d, id %d, aux %d (want 0, 0, 0, 0 or 1)", headLen, plen, id, aux)
	}
	return aux == 1, nil
}

package shm

import (
	"sync/atomic"
	"unsafe"
)

// Call slots (protocol/spec.md 10.8, hello flag bit 3 shm_calls): when both
// hellos set FeatureShmCalls and the region is accepted, the first
// CallsBlock bytes of each half are that side's control block, and unary
// requests and their answers are published in call slots there instead of
// on the socket. Payload slots (Alloc) start after the block.
const (
	// FeatureShmCalls is the hello feature flag (bit 3), set only with FeatureShm.
	FeatureShmCalls uint8 = 1 << 3
	// CallsBlock is the size of each half's control block.
	CallsBlock = 64 << 10
	// CallSlots is the number of call slots per connection.
	CallSlots = 32
	// CallLine0 and CallLine: slot k's words start at CallLine0 + CallLine*k
	// of each half's block.
	CallLine0 = 1024
	CallLine  = 128
	// CallArea0 and CallAreaSize: slot k's frame area is CallAreaSize bytes
	// at CallArea0 + CallAreaSize*k of each half's block.
	CallArea0    = 16 << 10
	CallAreaSize = 1536
	// OffBell (client block) and OffServerSleeping (server block).
	OffBell           = 0
	OffServerSleeping = 64
	// Offsets within a slot's line: the client's req_seq, req_len and
	// sleeping; the server's ans_seq and ans_len.
	OffSeq      = 0
	OffLen      = 4
	OffSleeping = 8
)

// NameBadCall is the error name of a call-slot violation (a length over
// the area, a sequence that jumps, an answer to no request, a bad frame in
// a slot): a connection error protocol_violation.
const NameBadCall = "bad_call"

// Calls is the view of the two control blocks of a region with call
// slots. Its words and areas are valid while a reference on the region is
// held (Region.Acquire). Nothing read from it is trusted: lengths are
// checked (CopyFrame) and each side keeps its sequences privately.
type Calls struct {
	cl, sv []byte
}

// NewCalls returns the control blocks of r, whose size passed CheckSize.
func NewCalls(r *Region) *Calls {
	half := r.size / 2
	return &Calls{cl: r.mem[:CallsBlock:CallsBlock], sv: r.mem[half : half+CallsBlock : half+CallsBlock]}
}

func word(b []byte, off int) *atomic.Uint32 {
	_ = b[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&b[off]))
}

// Bell is the client's bell: it adds 1 per request published (the server's futex word).
func (c *Calls) Bell() *atomic.Uint32 { return word(c.cl, OffBell) }

// ServerSleeping is 1 while the server is about to sleep or sleeps on Bell.
func (c *Calls) ServerSleeping() *atomic.Uint32 { return word(c.sv, OffServerSleeping) }

// ReqSeq, ReqLen and CallerSleeping are slot k's client words.
func (c *Calls) ReqSeq(k int) *atomic.Uint32 { return word(c.cl, CallLine0+CallLine*k+OffSeq) }

// ReqLen is the length of the request frame in slot k's client area.
func (c *Calls) ReqLen(k int) *atomic.Uint32 { return word(c.cl, CallLine0+CallLine*k+OffLen) }

// CallerSleeping is 1 while slot k's caller is about to sleep or sleeps on AnsSeq(k).
func (c *Calls) CallerSleeping(k int) *atomic.Uint32 {
	return word(c.cl, CallLine0+CallLine*k+OffSleeping)
}

// AnsSeq is slot k's answer sequence (the caller's futex word).
func (c *Calls) AnsSeq(k int) *atomic.Uint32 { return word(c.sv, CallLine0+CallLine*k+OffSeq) }

// AnsLen is the length of the answer frame in slot k's server area.
func (c *Calls) AnsLen(k int) *atomic.Uint32 { return word(c.sv, CallLine0+CallLine*k+OffLen) }

// ReqArea and AnsArea are slot k's frame areas in the client and server half.
func (c *Calls) ReqArea(k int) []byte { return area(c.cl, k) }

// AnsArea is slot k's frame area in the server half.
func (c *Calls) AnsArea(k int) []byte { return area(c.sv, k) }

func area(b []byte, k int) []byte {
	o := CallArea0 + CallAreaSize*k
	return b[o : o+CallAreaSize : o+CallAreaSize]
}

// CopyFrame copies the frame of n bytes a peer published in area into dst
// (a private buffer of CallAreaSize bytes) and returns it. n is the length
// word, read once by the caller; over the area, or under minLen, it is a
// *Error (NameBadCall).
func CopyFrame(dst *[CallAreaSize]byte, area []byte, n uint32, minLen int) ([]byte, error) {
	if n > CallAreaSize || int(n) < minLen {
		return nil, errf(NameBadCall, "a call slot's frame length %d is outside [%d, %d]", n, minLen, CallAreaSize)
	}
	copy(dst[:n], area[:n])
	return dst[:n], nil
}

// CheckCalls reports whether a region of size bytes can hold call slots.
func CheckCalls(size uint64) bool { return size/2 > CallsBlock }

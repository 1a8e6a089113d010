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
	// FeatureShmCallsBell is the hello feature flag (bit 4) of the client's
	// bell, set only with FeatureShm and FeatureShmCalls: the server bumps
	// CBell after each answer and wakes it only when CSleeping is 1; the
	// per-slot sleeping words are then unused.
	FeatureShmCallsBell uint8 = 1 << 4
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
	// OffCBell (server block) and OffCSleeping (client block), with
	// FeatureShmCallsBell only; 128 was unused in both blocks before it.
	OffCBell     = 128
	OffCSleeping = 128
	// Offsets within a slot's line: the client's req_seq, req_len and
	// sleeping; the server's ans_seq and ans_len.
	OffSeq      = 0
	OffLen      = 4
	OffSleeping = 8
	// PayloadArea0 and PayloadAreaSize: slot k's payload area is
	// PayloadAreaSize bytes at PayloadArea0 + PayloadAreaSize*k of each
	// half, right after the control block. It is owned exactly like the
	// slot, so a payload in it needs no shm_release (spec 10.8).
	PayloadArea0    = CallsBlock
	PayloadAreaSize = 64 << 10
	// CallsReserved is what call slots take at the start of each half (the
	// control block and the payload areas); payload slots start after it.
	CallsReserved = PayloadArea0 + CallSlots*PayloadAreaSize
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
	svOff  uint32 // the server half's offset in the region
}

// NewCalls returns the control blocks of r, whose size passed CheckSize.
func NewCalls(r *Region) *Calls {
	half := r.size / 2
	return &Calls{cl: r.mem[:CallsReserved:CallsReserved], sv: r.mem[half : half+CallsReserved : half+CallsReserved], svOff: uint32(half)}
}

func word(b []byte, off int) *atomic.Uint32 {
	_ = b[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&b[off]))
}

// Bell is the client's bell: it adds 1 per request published (the server's futex word).
func (c *Calls) Bell() *atomic.Uint32 { return word(c.cl, OffBell) }

// ServerSleeping is 1 while the server is about to sleep or sleeps on Bell.
func (c *Calls) ServerSleeping() *atomic.Uint32 { return word(c.sv, OffServerSleeping) }

// CBell is the client's bell (FeatureShmCallsBell): the server adds 1 per
// answer published (the client poller's futex word).
func (c *Calls) CBell() *atomic.Uint32 { return word(c.sv, OffCBell) }

// CSleeping is 1 while the client's poller is about to sleep or sleeps on CBell.
func (c *Calls) CSleeping() *atomic.Uint32 { return word(c.cl, OffCSleeping) }

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

// ReqPayload and AnsPayload are slot k's payload areas in the client and
// server half.
func (c *Calls) ReqPayload(k int) []byte { return payloadArea(c.cl, k) }

// AnsPayload is slot k's payload area in the server half.
func (c *Calls) AnsPayload(k int) []byte { return payloadArea(c.sv, k) }

func payloadArea(b []byte, k int) []byte {
	o := PayloadArea0 + PayloadAreaSize*k
	return b[o : o+PayloadAreaSize : o+PayloadAreaSize]
}

// PayloadOff is the region offset of slot k's payload area in the server's
// half (server) or the client's.
func (c *Calls) PayloadOff(server bool, k int) uint32 {
	o := uint32(PayloadArea0 + PayloadAreaSize*k)
	if server {
		o += c.svOff
	}
	return o
}

// AreaSlot is PayloadOff's inverse: k when d (of a non-zero length) starts
// at slot k's payload area in the server's half (server) or the client's,
// else -1.
func (c *Calls) AreaSlot(server bool, d Desc) int {
	base := c.PayloadOff(server, 0)
	if d.Len == 0 || d.Off < base || (d.Off-base)%PayloadAreaSize != 0 {
		return -1
	}
	if k := int((d.Off - base) / PayloadAreaSize); k < CallSlots {
		return k
	}
	return -1
}

// AreaDesc reports whether d, a descriptor in a frame of call slot k from
// the server's half (server) or the client's, names slot k's payload area:
// it then starts at the area and its length is in [1, PayloadAreaSize],
// else it is a *Error (NameBadCall). A descriptor that does not start at
// the area is an ordinary payload slot (false), checked as in 10.4; the
// areas lie outside the tracker's range, so one into any area fails there.
func (c *Calls) AreaDesc(server bool, k int, d Desc) (bool, error) {
	if d.Off != c.PayloadOff(server, k) {
		return false, nil
	}
	if d.Len < 1 || d.Len > PayloadAreaSize {
		return true, errf(NameBadCall, "call slot %d's payload area holds at most %d bytes, the descriptor says %d", k, PayloadAreaSize, d.Len)
	}
	return true, nil
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
func CheckCalls(size uint64) bool { return size/2 > CallsReserved }

// Stream slots (protocol/spec.md 10.9, hello flag bit 5 shm_streams): a
// client-stream call may live in a call slot, each direction a one-frame
// mailbox with a sequence word (the client's req_seq, the server's
// str_seq) and the peer's "taken" word. The new words lie in slot k's
// line, where 10.8 left room.
const (
	// FeatureShmStreams is the hello feature flag (bit 5), set only with
	// FeatureShm, FeatureShmCalls and FeatureShmCallsBell.
	FeatureShmStreams uint8 = 1 << 5
	// Server line: str_seq, str_len, req_taken, swant.
	OffStrSeq   = 8
	OffStrLen   = 12
	OffReqTaken = 16
	OffSWant    = 20
	// Client line: str_taken, cwant, clook; server line: slook.
	OffStrTaken = 12
	OffCWant    = 16
	OffCLook    = 20
	OffSLook    = 24
)

func (c *Calls) svLine(k, off int) *atomic.Uint32 { return word(c.sv, CallLine0+CallLine*k+off) }
func (c *Calls) clLine(k, off int) *atomic.Uint32 { return word(c.cl, CallLine0+CallLine*k+off) }

// StrSeq is slot k's stream sequence: the server adds 1 for each
// stream_data frame it publishes in the slot (10.9).
func (c *Calls) StrSeq(k int) *atomic.Uint32 { return c.svLine(k, OffStrSeq) }

// StrLen is the length of the stream_data frame in slot k's server area.
func (c *Calls) StrLen(k int) *atomic.Uint32 { return c.svLine(k, OffStrLen) }

// ReqTaken is the req_seq of the client frame the server last copied out
// of slot k (a stream slot's mailbox is free again when it equals req_seq).
func (c *Calls) ReqTaken(k int) *atomic.Uint32 { return c.svLine(k, OffReqTaken) }

// SWant is the str_seq whose take the server waits for (the client then
// adds 1 to Bell after it stores StrTaken), 0: none.
func (c *Calls) SWant(k int) *atomic.Uint32 { return c.svLine(k, OffSWant) }

// CLook is non-zero while slot k's receiver on the client looks at the
// slot itself (it takes what comes): the server then need not wake the
// client's poller for a frame of slot k.
func (c *Calls) CLook(k int) *atomic.Uint32 { return c.clLine(k, OffCLook) }

// SLook is CLook's mirror: slot k's handler on the server looks at the slot.
func (c *Calls) SLook(k int) *atomic.Uint32 { return c.svLine(k, OffSLook) }

// StrTaken is the str_seq of the server frame the client last copied out of slot k.
func (c *Calls) StrTaken(k int) *atomic.Uint32 { return c.clLine(k, OffStrTaken) }

// CWant is the req_seq whose take the client waits for (the server then
// adds 1 to CBell after it stores ReqTaken), 0: none.
func (c *Calls) CWant(k int) *atomic.Uint32 { return c.clLine(k, OffCWant) }

// StreamsInUse reports whether stream slots are in use between a client
// and a server whose hellos set these feature flags: both set bits 2, 3, 4
// and 5 (spec 10.9; the region must also be accepted and hold call slots).
func StreamsInUse(client, server uint8) bool {
	const all = FeatureShm | FeatureShmCalls | FeatureShmCallsBell | FeatureShmStreams
	return client&server&all == all
}

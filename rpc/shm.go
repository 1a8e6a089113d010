package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/uds"
)

// The shared-memory data path (protocol/spec.md, section 10; package
// internal/shm): on a local unix socket a client offers a sealed memfd in
// the handshake; payloads of at least the threshold then travel in the
// region, the frame carrying an 8-byte descriptor. Each side copies what it
// receives out of the region at once and releases the slot (shm_release),
// so a peer's later writes can touch only bytes it already handed over.

// connShm is one connection's shared-memory state.
type connShm struct {
	region    *shm.Region
	alloc     *shm.Alloc   // slots in this side's half
	track     *shm.Tracker // slots the peer handed over, until released
	threshold int
	server    bool

	sent, recv atomic.Uint64 // payloads through the region, each way
	overHalf   atomic.Uint64 // payloads too large for the half, sent on the socket
	flight     atomic.Int64  // (client) request bytes of region calls in flight (Client.connCall)
	stalledOut atomic.Uint64 // (server) answers sent on the socket while the reader waited for budget (shmPutAnswer)
	slotStats                // call slots (10.8): calls, payload-area bytes, spurious wake-ups (shmcalls_stats.go)

	// The client's held-back releases (sendRelease): bytes queued since the
	// last push, and the timer that pushes them.
	relBytes atomic.Uint64
	relArmed atomic.Bool
	relTimer *time.Timer

	// The buffer of releases queued off the reader (RawView.Release).
	viewMu  sync.Mutex
	viewRel [shm.DescSize]byte
}

func newConnShm(r *shm.Region, server bool, maxFrame uint32, threshold int) *connShm {
	cl, sv := shm.Halves(r.Size())
	mine, theirs := cl, sv
	if server {
		mine, theirs = sv, cl
	}
	if threshold <= 0 {
		threshold = shm.DefaultThreshold
	}
	return &connShm{
		region:    r,
		alloc:     shm.NewAlloc(uint32(mine[0]), uint32(mine[1]-mine[0])),
		track:     shm.NewTracker(theirs[0], theirs[1], maxFrame),
		threshold: threshold,
		server:    server,
	}
}

func (s *connShm) close() {
	if s.relTimer != nil {
		s.relTimer.Stop()
	}
	s.alloc.Close()
	s.region.Close()
}

// use reports whether a payload of n bytes goes in the region.
func (s *connShm) use(n int) bool {
	if s == nil || n < s.threshold {
		return false
	}
	if uint64(n) > s.alloc.Cap() {
		s.overHalf.Add(1)
		return false
	}
	return true
}

// takes reports whether a payload of n bytes would go in the region, as
// use does, without counting it.
func (s *connShm) takes(n int) bool {
	return s != nil && n >= s.threshold && uint64(n) <= s.alloc.Cap()
}

// room reports whether a region call of need bytes fits the connection's
// share in flight (shmFlightMax; need 0: not a region call, always).
func (s *connShm) room(need int64) bool {
	if s == nil || need == 0 {
		return true
	}
	f := s.flight.Load()
	return f == 0 || f+need <= shmFlightMax
}

// shmReserve counts need bytes of a region call in the connection's flight
// and returns what shmUnreserve gives back.
func (cc *clientConn) shmReserve(need int64) int64 {
	if need == 0 || cc.shm == nil {
		return 0
	}
	cc.shm.flight.Add(need)
	return need
}

// shmUnreserve gives back what shmReserve counted, once the call is over.
func (cc *clientConn) shmUnreserve(reserved int64) {
	if reserved != 0 {
		cc.shm.flight.Add(-reserved)
	}
}

// put copies p into a slot of this side's half, waiting within ctx while
// the half is full, and writes the slot's descriptor to desc.
func (s *connShm) put(ctx context.Context, p []byte, desc *[shm.DescSize]byte) error {
	d, err := s.alloc.Get(ctx, uint32(len(p)))
	if err != nil {
		return err
	}
	if !s.region.Acquire() {
		return shm.ErrClosed
	}
	if !s.server && len(p) <= shmHotRequest {
		copyHot(s.region.Bytes(d), p) // a request: the server reads it next
	} else {
		s.copy(s.region.Bytes(d), p, len(p))
	}
	s.region.Release()
	d.Put(desc[:])
	s.sent.Add(1)
	return nil
}

// tryPut is put without waiting: false when the half has no room now.
func (s *connShm) tryPut(p []byte, desc *[shm.DescSize]byte) bool {
	d, ok := s.alloc.TryGet(uint32(len(p)))
	if !ok {
		return false
	}
	if !s.region.Acquire() {
		s.alloc.Put(d)
		return false // put then fails with ErrClosed
	}
	s.copy(s.region.Bytes(d), p, len(p))
	s.region.Release()
	d.Put(desc[:])
	s.sent.Add(1)
	return true
}

// take checks the descriptor payload b from the peer and appends the bytes
// it names to dst (dst may be nil to drop them unread). The slot is then
// released: the caller sends rel's frame.
func (s *connShm) take(b, dst []byte, read bool) (out []byte, d shm.Desc, err error) {
	d, err = shm.ParseDesc(b)
	if err == nil {
		err = s.track.Accept(d)
	}
	if err != nil {
		return dst, d, err
	}
	if read && s.region.Acquire() {
		src := s.region.Bytes(d)
		dst = slices.Grow(dst, len(src))
		dst = dst[:len(dst)+len(src)]
		s.copy(dst[len(dst)-len(src):], src, 0)
		s.region.Release()
	}
	s.track.Drop(d)
	s.recv.Add(1)
	return dst, d, nil
}

// shmCopyChunk is the most connShm.copy copies at once when hot. Go's memmove
// copies 1 MiB or more with non-temporal stores, which bypass the cache: the
// peer, which reads the slot next, then reads it from memory. In pieces under
// that size the bytes stay in the cache the two cores share: a lone caller's
// 1 MiB echo took 25-45 % less time in one process. A client's request of
// up to shmHotRequest is always copied in pieces (copyHot): the server
// reads it next, usually within a millisecond, and reading 1 MiB from the
// cache instead of memory saved it 15 µs per 1 MiB echo at 16 callers
// (docs/shm-ring.md, "16 × 1 MiB"). Everything else (answers, stream items) is copied in pieces
// only when this side's half holds less than shmHotBytes besides
// (a proxy for "few calls in flight"): with many in flight they do not fit
// the cache, and the non-temporal stores save reading each line before
// writing it.
var shmCopyChunk = 512 << 10

// shmHotBytes: see shmCopyChunk.
const shmHotBytes = 1 << 20

// shmHotRequest is the largest request a client always copies in pieces
// (copyHot). Measured at 1 MiB; a larger one is less likely to still be in
// the cache when the server reads it, so it follows connShm.copy's rule.
const shmHotRequest = 2 << 20

// copy is copy(dst, src), in pieces of at most shmCopyChunk bytes when
// this side's half holds less than shmHotBytes besides own (the bytes of
// the slot being written, if it is one of ours).
func (s *connShm) copy(dst, src []byte, own int) {
	if len(src) > shmCopyChunk && s.alloc.InUse() < uint64(own)+shmHotBytes {
		copyHot(dst, src)
		return
	}
	copy(dst, src)
}

// copyHot is copy(dst, src) in pieces of at most shmCopyChunk bytes, so
// memmove uses ordinary stores and the bytes stay in the cache for the peer,
// which reads them next (shmCopyChunk says why).
func copyHot(dst, src []byte) {
	for len(src) > shmCopyChunk && len(dst) > shmCopyChunk {
		copy(dst[:shmCopyChunk], src[:shmCopyChunk])
		dst, src = dst[shmCopyChunk:], src[shmCopyChunk:]
	}
	copy(dst, src)
}

// releaseHeader is the header of a shm_release frame of one entry.
var releaseHeader = frame.Header{Type: frame.Type(shm.TypeRelease)}

// queueRelease queues a shm_release for d on w; the caller pushes.
func queueRelease(w *frame.Writer, d shm.Desc, buf *[shm.DescSize]byte) {
	d.Put(buf[:])
	h := releaseHeader
	w.QueueFrame(&h, nil, buf[:])
}

// shmPutAnswer is put for a unary answer on the server: it waits for space
// in the server's half as put does, but not while the connection's reader
// is held by the memory budget (budget.go: readerHeld). The reader then reads
// nothing, not even the shm_release frames queued behind the request it
// waits on, so the half cannot get room that way while this call holds its
// budget: waiting would be a deadlock (CallRawView callers of 6 MiB whose
// releases followed another caller's request did this). Then inRegion is
// false and the answer goes on the socket (counted: ShmStats.Stalled). The
// reader wakes the waiting answers as it stalls (wakeStalledAnswers), so
// they leave at once, not at a next look.
//
// An answer the reader itself runs (inline: the inline run, else 0) that
// finds the half full first gives the reading role to a new goroutine: the
// releases that would make room come through the reader. It waited for the
// inline watchdog before (up to 17 ms, TestShmStallWakes).
func (c *serverConn) shmPutAnswer(ctx context.Context, p []byte, desc *[shm.DescSize]byte, inline uint32) (inRegion bool, err error) {
	s := c.shm
	d, ok := shm.Desc{}, false
	if inline != 0 {
		if d, ok = s.alloc.TryGet(uint32(len(p))); !ok && c.inline.CompareAndSwap(inline, inlineHandedOff) {
			c.newReader()
		}
	}
	if !ok {
		d, ok, err = s.alloc.GetUnless(ctx, uint32(len(p)), c.answerGivesUp)
		if err != nil {
			return false, err
		}
		if !ok {
			s.stalledOut.Add(1)
			return false, nil
		}
	}
	if !s.region.Acquire() {
		return false, shm.ErrClosed
	}
	s.copy(s.region.Bytes(d), p, len(p))
	s.region.Release()
	d.Put(desc[:])
	s.sent.Add(1)
	return true, nil
}

// answerGivesUp is shmPutAnswer's giveUp: the reader is held by a budget
// (readerHeld), or the server's total is over MaxServerBytes while this
// answer waits. Then the reader will be held before its next frame
// (waitServerBudget: this call's bytes count on its connection), but it may
// first sit in a read of the socket that only the peer's next frame ends:
// when the call ran off the reader, or its reading was handed off before the
// answer's bytes counted in the total, the new reader found the total under
// the limit and went to read. The answer would then wait for releases that
// nobody reads (TestShmStalledCounted/total timed out so, 1 in 10 under -race).
func (c *serverConn) answerGivesUp() bool {
	return c.readerHeld() || c.s.held.Load() > c.s.opts.MaxServerBytes
}

// shmViolation is the connection error for a peer that broke section 10.
func shmViolation(err error) *Error {
	return &Error{Code: ProtocolViolation, Message: err.Error(), cause: err}
}

// ShmStats is a connection pool's or server's shared-memory state, summed
// over its connections (protocol/spec.md, section 10).
type ShmStats struct {
	// Conns counts connections using shared memory.
	Conns int
	// InUse is the bytes of this side's halves held by slots not yet
	// released by the peer; Capacity the halves' total size. InUse/Capacity
	// is the fill level.
	InUse, Capacity uint64
	// Sent and Received count payloads that went through the region.
	Sent, Received uint64
	// Waits counts payloads that waited for space (back-pressure).
	Waits uint64
	// OverHalf counts payloads larger than a half, sent on the socket.
	OverHalf uint64
	// Stalled counts a server's answers sent on the socket because its half
	// was full while the connection's reader waited for the memory budget
	// (ServerOptions.MaxConnBytes), or the server's total was over
	// MaxServerBytes: the releases that would make room were queued behind,
	// unread.
	Stalled uint64
	// SlotCalls counts unary calls that went through call slots
	// (ClientOptions.ShmCalls, protocol/spec.md 10.8). Their payloads of
	// the threshold up to 64 KiB travel in the slots' payload areas: they
	// count in Sent and Received, and their bytes in AreaSentBytes and
	// AreaReceivedBytes.
	SlotCalls                        uint64
	AreaSentBytes, AreaReceivedBytes uint64
	// SpuriousWakes counts wake-ups of a sleeper on the region (a slot
	// caller, the server's poller) that found its word unchanged: rare
	// races, or a peer flooding FUTEX_WAKE, whose connection ends past
	// spuriousBurst beyond spuriousRate a second.
	SpuriousWakes uint64
}

func (st *ShmStats) add(s *connShm) {
	if s == nil {
		return
	}
	st.Conns++
	st.InUse += s.alloc.InUse()
	st.Capacity += s.alloc.Cap()
	st.Sent += s.sent.Load()
	st.Received += s.recv.Load()
	st.Waits += s.alloc.Waits()
	st.OverHalf += s.overHalf.Load()
	st.Stalled += s.stalledOut.Load()
	st.addSlots(&s.slotStats)
}

// shmCapable returns the unix socket to pass the memfd on, when shared
// memory may be offered on conn: Linux, a plain local unix socket.
func shmCapable(conn net.Conn) *net.UnixConn {
	if !shm.Supported {
		return nil
	}
	uc, _ := conn.(*net.UnixConn)
	return uc
}

// clientOfferShm runs after the hellos when both set the shm flag: it sends
// the offer with the memfd and reads the server's answer (spec 10.2).
func clientOfferShm(uc *net.UnixConn, r *frame.Reader, region *shm.Region, fd int, maxFrame uint32, threshold int) (*connShm, error) {
	if err := uds.SendFDs(uc, shm.AppendOffer(nil, region.Size()), []int{fd}); err != nil {
		return nil, fmt.Errorf("send the shared-memory offer: %w", err)
	}
	var ans [shm.AnswerSize]byte
	if err := readFull(r, ans[:]); err != nil {
		return nil, fmt.Errorf("read the answer to the shared-memory offer: %w", err)
	}
	if ans[0] == byte(frame.TypeError) {
		h := frame.ParseHeader(ans[:])
		msg := make([]byte, min(int(h.HeadLen), frame.MaxHead))
		readFull(r, msg)
		return nil, &Error{Code: Code(h.Aux), Message: "server refused the shared-memory offer: " + string(msg)}
	}
	ok, err := shm.ParseAnswer(ans[:])
	if err != nil {
		return nil, shmViolation(err)
	}
	if !ok {
		return nil, nil
	}
	return newConnShm(region, false, maxFrame, threshold), nil
}

// serverAcceptShm reads the client's offer (the first frame after the
// hellos, with its memfd), checks and maps it, and answers (spec 10.2). A
// nil *connShm with a nil error: declined (no descriptor came: a relay).
func (c *serverConn) serverAcceptShm(uc *net.UnixConn) (*connShm, error) {
	if c.r.Buffered() != 0 {
		return nil, fmt.Errorf("udskit shm: the client sent %d bytes before reading the server's hello, so its offer's descriptor was lost", c.r.Buffered())
	}
	var buf [shm.OfferSize]byte
	var fds []int
	closeFDs := func() {
		for _, fd := range fds {
			shm.CloseFD(fd)
		}
		fds = nil
	}
	for got := 0; got < len(buf); {
		n, more, err := uds.RecvFDs(uc, buf[got:], 4)
		fds = append(fds, more...)
		if err != nil {
			closeFDs()
			if errors.Is(err, uds.ErrFDTruncated) {
				return nil, &shm.Error{Name: shm.NameBadOffer, Detail: "more than one descriptor came with the offer"}
			}
			return nil, err
		}
		got += n
	}
	size, err := shm.ParseOffer(buf[:])
	if err != nil {
		closeFDs()
		return nil, err
	}
	switch len(fds) {
	case 0:
		return nil, c.w.WriteRaw(shm.AppendAnswer(nil, false))
	case 1:
	default:
		closeFDs()
		return nil, &shm.Error{Name: shm.NameBadOffer, Detail: fmt.Sprintf("%d descriptors came with the offer, want 1", len(fds))}
	}
	region, err := shm.OpenOffer(fds[0], size)
	closeFDs()
	if err != nil {
		return nil, err
	}
	if err := c.w.WriteRaw(shm.AppendAnswer(nil, true)); err != nil {
		region.Close()
		return nil, err
	}
	return newConnShm(region, true, c.maxFrame, c.s.opts.ShmThreshold), nil
}

func readFull(r *frame.Reader, p []byte) error {
	_, err := io.ReadFull(r.BufReader(), p)
	return err
}

// shmPayload reads the descriptor payload of h (exactly 8 bytes, checked
// before reading) into the reader's buffer.
func (cc *clientConn) shmPayload(h frame.Header) ([]byte, error) {
	if cc.shm == nil {
		return nil, shmViolation(&shm.Error{Name: shm.NameBadDesc, Detail: "a descriptor on a connection without shared memory"})
	}
	if h.PayloadLen != shm.DescSize {
		return nil, shmViolation(&shm.Error{Name: shm.NameBadDesc, Detail: fmt.Sprintf("descriptor payload of %d bytes, want %d", h.PayloadLen, shm.DescSize)})
	}
	var err error
	cc.shmIn, err = cc.r.ReadPayload(&h, cc.shmIn[:0])
	return cc.shmIn, err
}

// shmTake reads a descriptor frame's payload from the region (a copy; nil
// when !want) and releases the slot at once.
func (cc *clientConn) shmTake(h frame.Header, want bool) ([]byte, error) {
	b, err := cc.shmPayload(h)
	if err != nil {
		return nil, err
	}
	out, d, err := cc.shm.take(b, nil, want)
	if err != nil {
		return nil, shmViolation(err)
	}
	cc.sendRelease(d)
	return out, nil
}

// sendRelease queues the release of d. It goes out with the connection's
// next write (a closed-loop caller's next request carries it: no write,
// and no wakeup of the server, of its own), at the latest releaseDelay
// later (a timer), or, once a quarter of the server's half waits to be
// released, before the reader next waits (handleFrame).
func (cc *clientConn) sendRelease(d shm.Desc) {
	queueRelease(cc.w, d, &cc.shmRel)
	if cc.shm.relBytes.Add(uint64(d.Len)) >= cc.shm.alloc.Cap()/4 {
		cc.shm.relBytes.Store(0)
		cc.shmPending = true
		return
	}
	if !cc.shm.relArmed.Swap(true) {
		cc.shm.relTimer.Reset(releaseDelay)
	}
}

// releaseDelay bounds how long a client holds a release back waiting for
// its next write.
const releaseDelay = time.Millisecond

// startReleaseTimer makes the timer that pushes held-back releases.
func (cc *clientConn) startReleaseTimer() {
	cs := cc.shm
	cs.relTimer = time.AfterFunc(time.Hour, func() {
		cs.relArmed.Store(false)
		cs.relBytes.Store(0)
		cc.w.Push()
	})
	cs.relTimer.Stop()
}

// shmResponse is handleFrame for a response whose payload is in the region.
func (cc *clientConn) shmResponse(h frame.Header, self *call, md Metadata) (mine bool, err error) {
	b, err := cc.shmPayload(h)
	if err != nil {
		return false, err
	}
	cl := cc.take(h.ID)
	if cl == nil || cl.stream != nil {
		// Its caller left (or a stream got a response): release unread.
		_, d, err := cc.shm.take(b, nil, false)
		if err != nil {
			return false, shmViolation(err)
		}
		cc.sendRelease(d)
		if cl != nil {
			cl.stream.finish(nil)
		}
		return false, nil
	}
	if cl.mdSink != nil {
		*cl.mdSink = md
	}
	if cl.view.want {
		return cc.shmResponseView(b, cl, self)
	}
	var d shm.Desc
	cl.resp, d, err = cc.shm.take(b, cl.resp, true)
	if err != nil {
		e := shmViolation(err)
		cl.code, cl.msg = e.Code, e.Message
	} else {
		cc.sendRelease(d)
	}
	if cl == self {
		return true, errOrNil(err)
	}
	cl.done <- struct{}{}
	return false, errOrNil(err)
}

func errOrNil(err error) error {
	if err == nil {
		return nil
	}
	return shmViolation(err)
}

// shmRelease handles a shm_release from the server: the slots go back to
// this side's allocator, each exactly as handed over.
func (cc *clientConn) shmRelease(h frame.Header) error {
	if cc.shm == nil {
		return shmViolation(&shm.Error{Name: shm.NameBadRelease, Detail: "a shm_release on a connection without shared memory"})
	}
	if h.PayloadLen > shm.MaxReleaseEntries*shm.DescSize || h.HeadLen != 0 {
		return shmViolation(&shm.Error{Name: shm.NameBadRelease, Detail: fmt.Sprintf("shm_release with a head of %d bytes and a payload of %d", h.HeadLen, h.PayloadLen)})
	}
	var err error
	cc.shmIn, err = cc.r.ReadPayload(&h, cc.shmIn[:0])
	if err != nil {
		return err
	}
	if err := shm.ParseRelease(h.ID, int(h.HeadLen), cc.shmIn, cc.shm.alloc.Put); err != nil {
		return shmViolation(err)
	}
	return nil
}

// shmDesc reads a request's descriptor payload (exactly 8 bytes, checked
// before reading) into the reader's buffer.
func (c *serverConn) shmDesc(h *frame.Header) ([]byte, error) {
	if c.shm == nil {
		return nil, &shm.Error{Name: shm.NameBadDesc, Detail: "a descriptor on a connection without shared memory"}
	}
	if h.PayloadLen != shm.DescSize {
		return nil, &shm.Error{Name: shm.NameBadDesc, Detail: fmt.Sprintf("descriptor payload of %d bytes, want %d", h.PayloadLen, shm.DescSize)}
	}
	var err error
	c.shmIn, err = c.r.ReadPayload(h, c.shmIn[:0])
	return c.shmIn, err
}

// shmLen is a checked descriptor's length.
func shmLen(desc []byte) uint32 {
	d, _ := shm.ParseDesc(desc)
	return d.Len
}

// shmTakeRequest copies a request's payload out of the region (appending to
// dst when read) and queues the slot's release: the handler gets private
// bytes, which the client can no longer change.
func (c *serverConn) shmTakeRequest(desc, dst []byte, read bool) ([]byte, error) {
	out, d, err := c.shm.take(desc, dst, read)
	if err != nil {
		return dst, err
	}
	queueRelease(c.w, d, &c.shmRel)
	c.shmQueued.Store(true)
	return out, nil
}

// onShmRelease handles a client's shm_release: slots of the server's half
// go back to its allocator, each exactly as handed over.
func (c *serverConn) onShmRelease(h *frame.Header) error {
	if c.shm == nil {
		return &shm.Error{Name: shm.NameBadRelease, Detail: "a shm_release on a connection without shared memory"}
	}
	if h.PayloadLen > shm.MaxReleaseEntries*shm.DescSize || h.HeadLen != 0 {
		return &shm.Error{Name: shm.NameBadRelease, Detail: fmt.Sprintf("shm_release with a head of %d bytes and a payload of %d", h.HeadLen, h.PayloadLen)}
	}
	var err error
	c.shmIn, err = c.r.ReadPayload(h, c.shmIn[:0])
	if err != nil {
		return err
	}
	return shm.ParseRelease(h.ID, int(h.HeadLen), c.shmIn, c.shm.alloc.Put)
}

// shmFailed ends the connection after a shared-memory error: a peer's
// violation gets a protocol_violation connection error.
func (c *serverConn) shmFailed(err error) {
	var se *shm.Error
	if errors.As(err, &se) {
		c.connError(ProtocolViolation, err)
		return
	}
	c.readFailed(err)
}

// ShmStats sums the shared-memory state of the client's connections.
func (c *Client) ShmStats() ShmStats {
	var st ShmStats
	c.mu.Lock()
	defer c.mu.Unlock()
	for cc := range c.live {
		st.add(cc.shm)
	}
	return st
}

// ShmStats sums the shared-memory state of the server's connections.
func (s *Server) ShmStats() ShmStats {
	var st ShmStats
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		cs := c.shm
		c.mu.Unlock()
		st.add(cs)
	}
	return st
}

// shmInPlace is a call's state under ServerOptions.ShmInPlace: the
// client's slot its handler reads in place, and the slot of the server's
// half offered to the handler as dst. Each holds a reference on the region
// (so the mapping outlives the connection until the handler is done) until
// shmEndCall, which also runs when the call is canceled, times out or its
// connection dies (run always reaches it).
type shmInPlace struct {
	req, out       bool     // a slot is held
	reqD, outD     shm.Desc // the slots
	reqSlot, outSl []byte   // their bytes, for the aliasing checks
	buf            []byte   // the pooled request buffer, put back after
	rel            [shm.DescSize]byte
	area           bool // the request is read in its call slot's payload area (a region reference held)
}

// shmAreaInPlace returns a slot call's request, in its call slot's payload
// area, for the handler to read in place, and offers it the slot's area of
// the server's half as dst (both are ours until the answer is published).
// A region reference is held until shmEndCall.
func (c *serverConn) shmAreaInPlace(call *srvCall, req, ans []byte) ([]byte, error) {
	if !c.shm.region.Acquire() {
		return call.req, shm.ErrClosed
	}
	p := &call.inPl
	p.area, p.buf, p.reqSlot, p.outSl = true, call.req, req, ans
	return req, nil
}

// shmRequestInPlace checks a request's descriptor and returns the slot's
// bytes for the handler to read in place: the slot stays held (tracked, not
// released) until the handler returns. The client can still write those
// bytes meanwhile; that is ServerOptions.ShmInPlace's documented cost.
func (c *serverConn) shmRequestInPlace(desc []byte, call *srvCall) ([]byte, error) {
	d, err := shm.ParseDesc(desc)
	if err == nil {
		err = c.shm.track.Accept(d)
	}
	if err != nil {
		return call.req, err
	}
	if !c.shm.region.Acquire() {
		c.shm.track.Drop(d)
		return call.req, shm.ErrClosed
	}
	c.shm.recv.Add(1)
	p := &call.inPl
	p.req, p.reqD, p.buf = true, d, call.req
	p.reqSlot = c.shm.region.Bytes(d)
	return p.reqSlot, nil
}

// shmResponseSlot offers a unary handler whose request came in place a
// slot of the server's half as dst, of the request's size or the threshold
// (whole granules), when one is free now (never waiting); else dst.
func (c *serverConn) shmResponseSlot(call *srvCall, dst []byte) []byte {
	n := uint64(max(len(call.req), c.shm.threshold))
	n = (n + shm.Granule - 1) &^ (shm.Granule - 1)
	if n > uint64(c.maxFrame) || n > c.shm.alloc.Cap()/4 { // room left for a copy if out is not the slot
		return dst
	}
	d, ok := c.shm.alloc.TryGet(uint32(n))
	if !ok {
		return dst
	}
	if !c.shm.region.Acquire() {
		c.shm.alloc.Put(d)
		return dst
	}
	p := &call.inPl
	p.out, p.outD = true, d
	p.outSl = c.shm.region.Bytes(d)
	return p.outSl[:0]
}

// shmOutInPlace sends out in its slot when the handler built it in the dst
// slot it was given (out starts at the slot, within it): the slot shrinks to
// len(out) and h gets the descriptor (in call.desc), no copy. Else false:
// the slot is freed by shmEndCall once out, which may point into it, is
// written.
func (c *serverConn) shmOutInPlace(call *srvCall, out []byte, h *frame.Header) bool {
	p := &call.inPl
	if len(out) == 0 || len(out) > len(p.outSl) || unsafe.SliceData(out) != unsafe.SliceData(p.outSl) {
		return false
	}
	d, err := c.shm.alloc.Shrink(p.outD, uint32(len(out)))
	if err != nil { // the connection closed and the allocator with it
		return false
	}
	p.out = false // the peer's now, until its shm_release
	c.shm.region.Release()
	d.Put(call.desc[:])
	h.Flags = shm.FlagShm
	c.shm.sent.Add(1)
	return true
}

// shmDstDone frees the call's dst slot, if it holds one the answer did not
// use, before the answer is put in a new slot: a handler that answers
// apart from dst (return req) must not hold one slot while it waits for
// another, or calls in flight could fill the half with idle dst slots and
// wait for each other. It reports false when out lies in the dst slot, not
// at its start: then out goes on the socket, written from the slot.
func (c *serverConn) shmDstDone(call *srvCall, out []byte) bool {
	p := &call.inPl
	if !p.out {
		return true
	}
	if overlaps(out, p.outSl) {
		return false
	}
	p.out = false
	c.shm.alloc.Put(p.outD)
	c.shm.region.Release()
	return true
}

// shmReleaseRequest ends the handler's hold on its request slot: the
// release is queued (push: written now) and the pooled buffer returns.
func (c *serverConn) shmReleaseRequest(call *srvCall, push bool) {
	p := &call.inPl
	if !p.req {
		return
	}
	p.req = false
	c.shm.track.Drop(p.reqD)
	c.shm.region.Release()
	queueRelease(c.w, p.reqD, &p.rel)
	if push {
		c.w.Push()
	} else {
		c.shmQueued.Store(true) // the reader pushes before it waits
	}
	call.req, p.buf = p.buf, nil
}

// shmEndCall ends whatever call still holds in place (run calls it after
// the answer, if any, is written) and reports whether out pointed into one
// of the call's slots (then it must not be reused as a buffer).
func (c *serverConn) shmEndCall(call *srvCall, out []byte, push bool) (regionOut bool) {
	p := &call.inPl
	if !p.req && !p.out && p.reqSlot == nil && p.outSl == nil {
		return false
	}
	regionOut = overlaps(out, p.reqSlot) || overlaps(out, p.outSl)
	if p.area {
		p.area = false
		c.shm.region.Release()
		call.req, p.buf = p.buf, nil
	}
	if p.out {
		p.out = false
		c.shm.alloc.Put(p.outD)
		c.shm.region.Release()
	}
	c.shmReleaseRequest(call, push)
	p.outSl, p.reqSlot = nil, nil
	return regionOut
}

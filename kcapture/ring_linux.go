package kcapture

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ringReader reads a BPF ring buffer in place: records are parsed straight
// from the mmapped ring and the space they took is handed back to the
// kernel (the consumer position advanced) only after the caller is done
// with them. A generic reader copies each record out first; at hundreds of
// MB/s that copy was a third of the capture's user-space work.
//
// Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position
// (written by us), page 1 the producer position, then the data area of
// size bytes mapped twice in a row, so a record that wraps is contiguous.
// Each record starts with an 8-byte header: its length (bit 31: still
// being written, bit 30: discarded) and a page offset, and is padded to 8
// bytes. Not safe for concurrent use.
type ringReader struct {
	fd   int
	epfd int
	cons []byte // the consumer page
	prod []byte // the producer page and the data area twice
	data []byte // prod[page:]
	size uint64
	pos  uint64 // our consumer position, published by commit
	ev   [1]unix.EpollEvent
	// The last record next returned: [start, pos).
	start uint64
	// Records kept in place after next moved on (messages that alias
	// them wait to be written), oldest first: the kernel gets space back
	// only up to the oldest one not released.
	held      []ringHold // released ones before heldHead
	heldHead  int
	heldBase  uint64 // id of held[0]
	heldBytes uint64 // bytes of the records held and not released
}

type ringHold struct {
	start, end uint64
	released   bool
}

const (
	ringBusy    = 1 << 31
	ringDiscard = 1 << 30
	ringHdr     = 8
)

// errRingRecord is returned for a record header that cannot come from the
// kernel (a length beyond the ring).
var errRingRecord = errors.New("kcapture: ring buffer record header out of range")

func newRingReader(fd int, size int) (*ringReader, error) {
	page := os.Getpagesize()
	if size <= 0 || size&(size-1) != 0 || size%page != 0 {
		return nil, fmt.Errorf("kcapture: ring buffer size %d is not a power of two multiple of the page size", size)
	}
	r := &ringReader{fd: fd, epfd: -1, size: uint64(size)}
	var err error
	r.cons, err = unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kcapture: mapping the ring buffer's consumer page: %w", err)
	}
	r.prod, err = unix.Mmap(fd, int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("kcapture: mapping the ring buffer: %w", err)
	}
	r.data = r.prod[page:]
	r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("kcapture: epoll: %w", err)
	}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}); err != nil {
		r.close()
		return nil, fmt.Errorf("kcapture: epoll on the ring buffer: %w", err)
	}
	r.pos = atomic.LoadUint64(r.consPtr())
	return r, nil
}

func (r *ringReader) consPtr() *uint64 { return (*uint64)(unsafe.Pointer(&r.cons[0])) }
func (r *ringReader) prodPtr() *uint64 { return (*uint64)(unsafe.Pointer(&r.prod[0])) }

// next returns the next record's bytes, valid until commit, or ok false
// when no complete record is waiting. Discarded records are skipped.
func (r *ringReader) next() (rec []byte, ok bool, err error) {
	for {
		prod := atomic.LoadUint64(r.prodPtr())
		if r.pos >= prod {
			return nil, false, nil
		}
		if prod-r.pos > r.size {
			return nil, false, fmt.Errorf("%w: producer %d bytes ahead of a %d-byte ring", errRingRecord, prod-r.pos, r.size)
		}
		off := r.pos & (r.size - 1)
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[off])))
		if hdr&ringBusy != 0 {
			return nil, false, nil
		}
		n := uint64(hdr &^ (ringBusy | ringDiscard))
		if n > r.size-ringHdr {
			return nil, false, fmt.Errorf("%w: %d bytes in a %d-byte ring", errRingRecord, n, r.size)
		}
		start := off + ringHdr
		r.start = r.pos
		r.pos += (n + ringHdr + 7) &^ 7
		if hdr&ringDiscard != 0 {
			continue
		}
		return r.data[start : start+n : start+n], true, nil
	}
}

// hold keeps the record next returned last in the ring after commit, until
// release(id): its bytes stay valid that long.
func (r *ringReader) hold() (id uint64) {
	r.held = append(r.held, ringHold{start: r.start, end: r.pos})
	r.heldBytes += r.pos - r.start
	return r.heldBase + uint64(len(r.held)) - 1
}

// release ends a hold; an id not held is ignored.
func (r *ringReader) release(id uint64) {
	if id < r.heldBase+uint64(r.heldHead) || id-r.heldBase >= uint64(len(r.held)) {
		return
	}
	h := &r.held[id-r.heldBase]
	if !h.released {
		h.released = true
		r.heldBytes -= h.end - h.start
	}
}

// commit hands back to the kernel the space of every record returned so
// far, up to the oldest one still held: the bytes of records not held
// must not be used after it.
func (r *ringReader) commit() {
	for r.heldHead < len(r.held) && r.held[r.heldHead].released {
		r.heldHead++
	}
	switch {
	case r.heldHead == len(r.held):
		r.heldBase += uint64(len(r.held))
		r.held, r.heldHead = r.held[:0], 0
	case r.heldHead >= 1024 && r.heldHead > len(r.held)/2:
		n := copy(r.held, r.held[r.heldHead:])
		r.heldBase += uint64(r.heldHead)
		r.held, r.heldHead = r.held[:n], 0
	}
	pos := r.pos
	if r.heldHead < len(r.held) {
		pos = r.held[r.heldHead].start
	}
	if pos > atomic.LoadUint64(r.consPtr()) {
		atomic.StoreUint64(r.consPtr(), pos)
	}
}

// wait blocks until the kernel wakes the reader or timeout passes.
// Edge-triggered: the ring reads as ready whenever the consumer position
// is behind the producer's, which it always is while records are held, so
// only the kernel's wakeups (and the timeout) end the wait.
func (r *ringReader) wait(timeout time.Duration) error {
	ms := int(timeout / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	_, err := unix.EpollWait(r.epfd, r.ev[:], ms)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("kcapture: waiting for the ring buffer: %w", err)
	}
	return nil
}

func (r *ringReader) close() {
	if r.epfd >= 0 {
		unix.Close(r.epfd)
		r.epfd = -1
	}
	if r.prod != nil {
		unix.Munmap(r.prod)
		r.prod, r.data = nil, nil
	}
	if r.cons != nil {
		unix.Munmap(r.cons)
		r.cons = nil
	}
}

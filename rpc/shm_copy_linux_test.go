package rpc

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/udskit/udskit/internal/shm"
)

// TestShmCopyPieces: connShm.copy copies exactly, in pieces (an idle
// half) or whole (a busy one), at sizes around the piece size.
func TestShmCopyPieces(t *testing.T) {
	s := &connShm{alloc: shm.NewAlloc(0, 64<<20)}
	busy, ok := s.alloc.TryGet(2 * shmHotBytes)
	if !ok {
		t.Fatal("no slot")
	}
	for _, idle := range []bool{true, false} {
		if idle {
			s.alloc.Put(busy)
		}
		for _, n := range []int{0, 1, shmCopyChunk - 1, shmCopyChunk, shmCopyChunk + 1, 3*shmCopyChunk + 4097} {
			src, dst := pattern(n, n), make([]byte, n)
			s.copy(dst, src, 0)
			if !bytes.Equal(dst, src) {
				t.Fatalf("idle %v, %d bytes: copy differs", idle, n)
			}
		}
	}
}

// TestShmCopyHot: copyHot (a client's request into its slot, always in
// pieces) copies exactly at sizes around the piece size, and no further
// than the shorter of dst and src, as copy does.
func TestShmCopyHot(t *testing.T) {
	for _, n := range []int{0, 1, shmCopyChunk - 1, shmCopyChunk, shmCopyChunk + 1, 2 * shmCopyChunk, 3*shmCopyChunk + 4097} {
		src := pattern(n, n)
		dst := bytes.Repeat([]byte{0xA5}, n+3)
		copyHot(dst, src)
		if !bytes.Equal(dst[:n], src) || !bytes.Equal(dst[n:], []byte{0xA5, 0xA5, 0xA5}) {
			t.Fatalf("%d bytes: copy differs or wrote past the source", n)
		}
		if n > 1 {
			short := make([]byte, n/2)
			copyHot(short, src)
			if !bytes.Equal(short, src[:n/2]) {
				t.Fatalf("%d bytes into %d: copy differs", n, n/2)
			}
		}
	}
}

// BenchmarkShmCopyPieces: echoes of 1 MiB by 1 and 16 callers with the
// region copies in pieces when the half is nearly idle (the default) and
// always whole (Go's memmove: non-temporal stores from 1 MiB on), side by
// side. For comparisons in one process, not for figures.
func BenchmarkShmCopyPieces(b *testing.B) {
	for _, conc := range []int{1, 16} {
		for _, view := range []bool{true, false} {
			for _, ch := range []int{512 << 10, 1 << 40} {
				name := "pieces"
				if ch > 1<<30 {
					name = "whole"
				}
				b.Run(fmt.Sprintf("%dx1MiB/view=%v/%s", conc, view, name), func(b *testing.B) {
					old := shmCopyChunk
					shmCopyChunk = ch
					defer func() { shmCopyChunk = old }()
					benchShmEcho(b, 1<<20, conc, view, 0)
				})
			}
		}
	}
}

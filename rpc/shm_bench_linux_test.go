package rpc

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkShmEcho1MiB: one caller, 1 MiB echo through the region
// (client and server in this process; for profiles, not for figures).
func BenchmarkShmEcho1MiB(b *testing.B) { benchShmEcho(b, 1<<20, 1, false, 0) }

// BenchmarkShmEcho16x1MiB: 16 callers, 1 MiB each.
func BenchmarkShmEcho16x1MiB(b *testing.B) { benchShmEcho(b, 1<<20, 16, false, 0) }

// BenchmarkShmEcho16x64KiB: 16 callers, 64 KiB each.
func BenchmarkShmEcho16x64KiB(b *testing.B) { benchShmEcho(b, 64<<10, 16, false, 0) }

// BenchmarkShmEchoInPlaceView: the same workloads with the server's
// ShmInPlace and the callers' CallRawView (two copies per echo), at 16
// callers also with 1, 2, 4 and 16 connections for them (ShmConns).
func BenchmarkShmEchoInPlaceView(b *testing.B) {
	b.Run("1x1MiB", func(b *testing.B) { benchShmEcho(b, 1<<20, 1, true, 0) })
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, lc := range []int{1, 2, 4, 16} {
			b.Run(fmt.Sprintf("16x%dKiB/ShmConns=%d", size>>10, lc), func(b *testing.B) { benchShmEcho(b, size, 16, true, lc) })
		}
	}
}

func benchShmEcho(b *testing.B, size, conc int, view bool, shmConns int) {
	s := NewServer(ServerOptions{ShmInPlace: view})
	s.HandleRaw("echo", func(_ context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	c := dialOpts(b, startServer(b, s), ClientOptions{ShmConns: shmConns})
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/conc + 1
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, dst := pattern(size, 1), make([]byte, 0, size)
			for range per {
				var err error
				if view {
					var v RawView
					v, err = c.CallRawView(ctx, "echo", p, dst[:0])
					v.Release()
				} else {
					_, err = c.CallRaw(ctx, "echo", p, dst[:0])
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

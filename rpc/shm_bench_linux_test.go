package rpc

import (
	"context"
	"sync"
	"testing"
)

// BenchmarkShmEcho1MiB: one caller, 1 MiB echo through the region
// (client and server in this process; for profiles, not for figures).
func BenchmarkShmEcho1MiB(b *testing.B) { benchShmEcho(b, 1<<20, 1) }

// BenchmarkShmEcho16x1MiB: 16 callers, 1 MiB each.
func BenchmarkShmEcho16x1MiB(b *testing.B) { benchShmEcho(b, 1<<20, 16) }

// BenchmarkShmEcho16x64KiB: 16 callers, 64 KiB each.
func BenchmarkShmEcho16x64KiB(b *testing.B) { benchShmEcho(b, 64<<10, 16) }

func benchShmEcho(b *testing.B, size, conc int) {
	c := dialOpts(b, startServer(b, echoServer()), ClientOptions{})
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
				if _, err := c.CallRaw(ctx, "echo", p, dst[:0]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

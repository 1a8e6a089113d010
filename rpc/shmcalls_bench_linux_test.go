package rpc

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
)

// BenchmarkShmCalls: 16 callers (or 1) of 64 B and 64 KiB echoes in one
// process, with and without call slots (go test -bench ShmCalls ./rpc).
// naps/op: a caller's FUTEX_WAIT slept its whole nap (10 ms); missed/op:
// and the answer was in by then (its wake came late or not at all).
func BenchmarkShmCalls(b *testing.B) {
	s := echoServer()
	addr := startServer(b, s)
	for _, calls := range []bool{false, true} {
		for _, conc := range []int{1, 16} {
			for _, size := range []int{64, 64 << 10} {
				b.Run(fmt.Sprintf("calls=%v/conc=%d/size=%d", calls, conc, size), func(b *testing.B) {
					c := dialOpts(b, addr, ClientOptions{ShmCalls: calls})
					req := pattern(size, 1)
					b.SetBytes(int64(size))
					var wg sync.WaitGroup
					per := b.N/conc + 1
					var ru0, ru1 syscall.Rusage
					syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
					b.ResetTimer()
					for range conc {
						wg.Add(1)
						go func() {
							defer wg.Done()
							dst := make([]byte, 0, size)
							for range per {
								var err error
								if dst, err = c.CallRaw(context.Background(), "echo", req, dst[:0]); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
					b.ReportMetric(float64(ru1.Minflt-ru0.Minflt)/float64(per*conc), "minflt/op")
					b.ReportMetric(float64(ru1.Nvcsw-ru0.Nvcsw+ru1.Nivcsw-ru0.Nivcsw)/float64(per*conc), "ctxsw/op")
					if calls {
						naps, missed := c.slotNaps()
						b.ReportMetric(float64(naps)/float64(per*conc), "naps/op")
						b.ReportMetric(float64(missed)/float64(per*conc), "missed/op")
					}
				})
			}
		}
	}
}

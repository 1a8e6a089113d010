package rpcprom_test

import (
	"context"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/rpc/rpcprom"
	"github.com/udskit/udskit/uds"
)

// BenchmarkThroughput: 16 callers of 1 KiB echo calls on one client, with
// and without the metrics interceptors on both sides (the target:
// with ≥ 0.9x the calls/s of without). Compare the two with, e.g.:
//
//	go test -run '^$' -bench Throughput -benchtime 20000x -count 6 ./rpc/rpcprom
func BenchmarkThroughput(b *testing.B) {
	for _, withMetrics := range []bool{false, true} {
		name := "plain"
		if withMetrics {
			name = "metrics"
		}
		b.Run(name, func(b *testing.B) {
			sopts, copts := rpc.ServerOptions{}, rpc.ClientOptions{}
			if withMetrics {
				m := rpcprom.New(rpcprom.Options{})
				sopts, copts = m.ServerOptions(sopts), m.ClientOptions(copts)
			}
			addr := "unix:" + filepath.Join(b.TempDir(), "b.sock")
			l, err := uds.Listen(context.Background(), addr, uds.ListenOptions{})
			if err != nil {
				b.Fatal(err)
			}
			s := rpc.NewServer(sopts)
			s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
			go s.Serve(l)
			defer s.Close()
			c, err := rpc.Dial(context.Background(), addr, copts)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const callers = 16
			p := make([]byte, 1024)
			b.SetBytes(1024)
			cpu0 := cpuTime()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i := range callers {
				n := b.N / callers
				if i < b.N%callers {
					n++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					dst := make([]byte, 0, 1024)
					for range n {
						if _, err := c.CallRaw(context.Background(), "echo", p, dst[:0]); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			// CPU per call (client and server together): steadier than
			// calls/s on a machine shared with other work.
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/call")
		})
	}
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/rpc"
)

// killCycles runs 8 callers with 2 s deadlines against a server that is
// killed with SIGKILL and restarted, cycles times, and reports calls that
// returned later than their deadline.
func killCycles(sock string, logf *os.File, cycles int) error {
	srv, err := startServer(sock, logf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := rpc.Dial(ctx, "unix:"+sock, rpc.ClientOptions{Wait: true})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	const deadline = 2 * time.Second
	var calls, failed, late atomic.Int64
	var worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []byte(`{"ms":20}`)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := c.CallRaw(ctx, "sleep", p, nil)
				cancel()
				el := time.Since(start)
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
				if el > deadline+50*time.Millisecond {
					late.Add(1)
				}
				for {
					w := worst.Load()
					if int64(el) <= w || worst.CompareAndSwap(w, int64(el)) {
						break
					}
				}
			}
		}()
	}
	for i := 0; i < cycles; i++ {
		time.Sleep(700 * time.Millisecond)
		srv.cmd.Process.Kill()
		<-srv.done
		if srv, err = startServer(sock, logf); err != nil {
			close(stop)
			wg.Wait()
			return err
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	srv.stop()
	fmt.Printf("\nkill -9 under load: %d cycles, 8 callers, %v deadlines: %d calls, %d failed (expected around kills), %d past their deadline, slowest %v\n",
		cycles, deadline, calls.Load(), failed.Load(), late.Load(), time.Duration(worst.Load()).Round(time.Millisecond))
	if late.Load() > 0 {
		return fmt.Errorf("%d calls returned past their deadline", late.Load())
	}
	return nil
}

package pcapng

import (
	"io"
	"os"
	"sync"
)

// DefaultAsyncBuffer is Options.AsyncBuffer when it is 0.
const DefaultAsyncBuffer = 8 << 20

// asyncOut writes chunks, in order, from a background goroutine, holding at
// most limit bytes: put blocks while the buffer is full.
//
// Lock invariant: mu guards queue, pending, err and closing; cond is
// signalled when any of them changes.
type asyncOut struct {
	limit int

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []chunk
	pending  int
	err      error
	closing  bool
	finished chan struct{}
	free     []*[]byte // buffers to reuse (mu); at most maxFree
}

const maxFree = 64

// chunk is bytes for out, or (closeOut) the order to close out.
type chunk struct {
	out      io.Writer
	data     *[]byte
	closeOut bool
}

func newAsync(limit int) *asyncOut {
	a := &asyncOut{limit: limit, finished: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	go a.run()
	return a
}

// put copies bufs into the queue for out, waiting for room.
func (a *asyncOut) put(out io.Writer, bufs [][]byte) error {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	var bp *[]byte
	a.mu.Lock()
	for i := len(a.free) - 1; i >= 0; i-- {
		if cap(*a.free[i]) >= n {
			bp = a.free[i]
			a.free = append(a.free[:i], a.free[i+1:]...)
			break
		}
	}
	a.mu.Unlock()
	if bp == nil {
		b := make([]byte, 0, max(n, 64<<10))
		bp = &b
	}
	d := (*bp)[:0]
	for _, b := range bufs {
		d = append(d, b...)
	}
	*bp = d
	a.mu.Lock()
	defer a.mu.Unlock()
	limit := a.limit
	if n <= smallChunk {
		limit += smallSlack // headers-only blocks of a dropping writer
	}
	for a.err == nil && a.pending > 0 && a.pending+n > limit {
		a.cond.Wait()
	}
	if a.err != nil {
		a.recycle(bp)
		return a.err
	}
	a.queue = append(a.queue, chunk{out: out, data: bp})
	a.pending += n
	a.cond.Broadcast()
	return nil
}

// Small chunks (blocks without payload) may use smallSlack bytes beyond the
// limit, so a writer that drops payloads rarely waits.
const (
	smallChunk = 64 << 10
	smallSlack = 1 << 20
)

// room reports whether n more bytes fit without waiting.
func (a *asyncOut) room(n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending == 0 || a.pending+n <= a.limit
}

// closeAfter closes out once everything queued for it is written.
func (a *asyncOut) closeAfter(out io.Writer) {
	a.mu.Lock()
	a.queue = append(a.queue, chunk{out: out, closeOut: true})
	a.cond.Broadcast()
	a.mu.Unlock()
}

func (a *asyncOut) getErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// finish writes what is queued, stops the goroutine and returns the first
// error.
func (a *asyncOut) finish() error {
	a.mu.Lock()
	a.closing = true
	a.cond.Broadcast()
	a.mu.Unlock()
	<-a.finished
	return a.getErr()
}

func (a *asyncOut) run() {
	defer close(a.finished)
	var iov [][]byte
	for {
		a.mu.Lock()
		for len(a.queue) == 0 && !a.closing {
			a.cond.Wait()
		}
		if len(a.queue) == 0 {
			a.mu.Unlock()
			return
		}
		batch := a.queue
		a.queue = nil
		failed := a.err != nil
		a.mu.Unlock()

		var err error
		done := 0
		for i := 0; i < len(batch); {
			c := batch[i]
			if c.closeOut {
				if cl, ok := c.out.(io.Closer); ok {
					if cerr := cl.Close(); err == nil && !failed {
						err = cerr
					}
				}
				i++
				continue
			}
			// Consecutive chunks for one output go out in one writev.
			j := i
			iov = iov[:0]
			for ; j < len(batch) && !batch[j].closeOut && batch[j].out == c.out; j++ {
				iov = append(iov, *batch[j].data)
				done += len(*batch[j].data)
			}
			if err == nil && !failed {
				err = writeAll(c.out, iov)
			}
			i = j
		}
		clear(iov)
		a.mu.Lock()
		if err != nil && a.err == nil {
			a.err = err
		}
		a.pending -= done
		for _, c := range batch {
			if c.data != nil {
				a.recycle(c.data)
			}
		}
		a.cond.Broadcast()
		a.mu.Unlock()
	}
}

// recycle keeps bp for reuse, up to maxFree buffers; the caller holds mu.
func (a *asyncOut) recycle(bp *[]byte) {
	if len(a.free) < maxFree {
		a.free = append(a.free, bp)
	}
}

// writeAll writes bufs to out: writev on files and pipes, else one Write
// of the joined bytes per buffer.
func writeAll(out io.Writer, bufs [][]byte) error {
	if f, ok := out.(*os.File); ok {
		_, err := writev(f, bufs)
		return err
	}
	for _, b := range bufs {
		n, err := out.Write(b)
		if err == nil && n < len(b) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return err
		}
	}
	return nil
}

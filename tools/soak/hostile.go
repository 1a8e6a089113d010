package main

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udskit/udskit/frame"
)

// attack is one hostile scenario: open opens its connections (and starts
// whatever they do); each is watched until the server closes it.
type attack struct {
	name  string
	conns int
	bound time.Duration // the timeout that should close them (plus sweep and grace)
	open  func(h *hostile) error
}

// hostile tracks the hostile connections of one attack.
type hostile struct {
	sock    string
	start   time.Time
	limit   time.Duration
	wg      sync.WaitGroup
	mu      sync.Mutex
	last    time.Time
	stalled time.Duration // writeUntilClosed: longest time from a connection's last completed write to its close
	open    atomic.Int64
	// stuck runs once when a connection is still open at the limit, while
	// it still is (run: the server's goroutines into its log).
	stuck     func()
	stuckOnce sync.Once
	dialErr   atomic.Int64
}

func (h *hostile) dial() (net.Conn, error) {
	c, err := net.DialTimeout("unix", h.sock, 5*time.Second)
	if err != nil {
		h.dialErr.Add(1)
	}
	return c, err
}

// closed records that a hostile connection was closed by the server now.
func (h *hostile) closed() {
	h.mu.Lock()
	h.last = time.Now()
	h.mu.Unlock()
	h.open.Add(-1)
}

// readUntilClosed watches c: it discards what the server sends until EOF.
func (h *hostile) readUntilClosed(c net.Conn) {
	h.watch(c, func() error {
		c.SetReadDeadline(h.start.Add(h.limit))
		_, err := io.Copy(io.Discard, c)
		return err
	})
}

// writeUntilClosed runs write on c (never reading) until it fails.
func (h *hostile) writeUntilClosed(c net.Conn, write func() error) {
	h.watch(c, func() error {
		c.SetWriteDeadline(h.start.Add(h.limit))
		last := time.Now()
		for {
			if err := write(); err != nil {
				h.mu.Lock()
				h.stalled = max(h.stalled, time.Since(last))
				h.mu.Unlock()
				return err
			}
			last = time.Now()
		}
	})
}

// watch runs until(c) in a goroutine: the connection counts as closed by the
// server when it returns, and as still open when it ends on our deadline.
func (h *hostile) watch(c net.Conn, until func() error) {
	h.open.Add(1)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer c.Close()
		if ne, ok := until().(net.Error); ok && ne.Timeout() {
			if h.stuck != nil {
				h.stuckOnce.Do(h.stuck) // see what the server does with it
			}
			return // still open at the limit: counted as open
		}
		h.closed()
	}()
}

// many dials n connections, sends each first, and watches them.
func (h *hostile) many(n int, first []byte) error {
	for i := 0; i < n; i++ {
		c, err := h.dial()
		if err != nil {
			continue
		}
		if len(first) > 0 {
			c.Write(first)
		}
		h.readUntilClosed(c)
	}
	return nil
}

func helloBytes() []byte {
	var b [frame.HelloSize]byte
	h := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit, MaxFrame: frame.DefaultMaxFrame}
	h.Put(b[:])
	return b[:]
}

func requestBytes(id uint32, method string, payloadLen int, payload []byte) []byte {
	head := frame.AppendRequestHead(nil, method)
	h := frame.Header{Type: frame.TypeRequest, ID: id, HeadLen: uint16(len(head)), PayloadLen: uint32(payloadLen)}
	return append(append(h.Append(nil), head...), payload...)
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

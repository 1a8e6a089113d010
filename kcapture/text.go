package kcapture

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// TextSink prints each message as one line (time, connection, direction,
// length) and its first MaxBytes bytes with unprintable bytes as '.', like
// tcpdump -A: a quick look without Wireshark. Safe for concurrent use.
type TextSink struct {
	W        io.Writer
	MaxBytes int // default 256

	mu sync.Mutex
	n  int
}

// OpenConn implements Sink.
func (s *TextSink) OpenConn(info ConnInfo, t time.Time) (ConnSink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	id := s.n
	name := info.Path
	if name == "" {
		name = "(unnamed)"
	}
	_, err := fmt.Fprintf(s.W, "%s #%d %s %s\n", t.Format("15:04:05.000000"), id, name, info.Comment())
	return &textConn{s: s, id: id}, err
}

// Dropped implements Sink.
func (s *TextSink) Dropped(t time.Time, n uint64, comment string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := fmt.Fprintf(s.W, "%s LOST %d events: %s\n", t.Format("15:04:05.000000"), n, comment)
	return err
}

type textConn struct {
	s  *TextSink
	id int
}

func (c *textConn) Data(dir Dir, t time.Time, p []byte, note string) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	arrow := "client > server"
	if dir == ServerToClient {
		arrow = "server > client"
	}
	max := s.MaxBytes
	if max <= 0 {
		max = 256
	}
	show := p[:min(len(p), max)]
	buf := make([]byte, len(show))
	for i, b := range show {
		if b < 0x20 || b > 0x7e {
			b = '.'
		}
		buf[i] = b
	}
	if note != "" {
		note = " [" + note + "]"
	}
	more := ""
	if len(show) < len(p) {
		more = "..."
	}
	_, err := fmt.Fprintf(s.W, "%s #%d %s %d bytes%s\n  %s%s\n", t.Format("15:04:05.000000"), c.id, arrow, len(p), note, buf, more)
	return err
}

func (c *textConn) Lost(dir Dir, n int64) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := fmt.Fprintf(s.W, "#%d %d bytes not captured\n", c.id, n)
	return err
}

package kcapture

import (
	"bytes"
	"sync"
	"time"
)

// fakeSink records connections in memory.
type fakeSink struct {
	mu      sync.Mutex
	conns   []*fakeConn
	dropped uint64
}

type fakeConn struct {
	info          ConnInfo
	data          [2]bytes.Buffer
	msgs          [2][][]byte
	lost          [2]int64
	notes         []string
	ended         [2]bool
	closed, reset bool
}

func (s *fakeSink) OpenConn(info ConnInfo, t time.Time) (ConnSink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &fakeConn{info: info}
	s.conns = append(s.conns, c)
	return c, nil
}

func (s *fakeSink) Dropped(t time.Time, n uint64, comment string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped += n
	return nil
}

func (c *fakeConn) Data(dir Dir, t time.Time, p []byte, note string) error {
	c.data[dir].Write(p)
	c.msgs[dir] = append(c.msgs[dir], append([]byte(nil), p...))
	if note != "" {
		c.notes = append(c.notes, note)
	}
	return nil
}

func (c *fakeConn) Lost(dir Dir, t time.Time, n int64) error {
	c.lost[dir] += n
	return nil
}

func (c *fakeConn) End(dir Dir, t time.Time) error {
	c.ended[dir] = true
	return nil
}

func (c *fakeConn) Close(reset bool, t time.Time) error {
	c.closed, c.reset = true, reset
	return nil
}

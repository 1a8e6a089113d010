package kcapture

import (
	"bytes"
	"sync"
	"time"

	"github.com/udskit/udskit/record"
)

// fakeSink records connections in memory: a record.Sink whose recordings
// are record.LostRecorders and which is a record.DropRecorder.
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

func (s *fakeSink) Open(ci record.ConnInfo) record.Recording {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &fakeConn{info: *ci.Detail.(*ConnInfo)}
	s.conns = append(s.conns, c)
	return c
}

func (s *fakeSink) Err() error { return nil }

func (s *fakeSink) Dropped(t time.Time, n uint64, comment string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped += n
}

func (c *fakeConn) Data(dir Dir, t time.Time, p []byte, note string) {
	c.data[dir].Write(p)
	c.msgs[dir] = append(c.msgs[dir], append([]byte(nil), p...))
	if note != "" {
		c.notes = append(c.notes, note)
	}
}

func (c *fakeConn) Lost(dir Dir, t time.Time, n int64) {
	c.lost[dir] += n
}

func (c *fakeConn) End(dir Dir, t time.Time) {
	c.ended[dir] = true
}

func (c *fakeConn) Close(reset bool, t time.Time) {
	c.closed, c.reset = true, reset
}

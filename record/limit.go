package record

import (
	"sync"
	"sync/atomic"
	"time"
)

// Limit returns a Sink that records the first n data messages (Recording.Data
// calls with bytes: one relayed read, one syscall seen by the kernel, one
// write of a wrapped conn) into s and drops the rest, and calls done once, from
// the goroutine that recorded the n-th, right after recording it. This is what
// udskit capture --count means in every mode: like tcpdump -c, a count of
// packets, not of connections (a message over the pcapng segment size may
// fill more than one packet of the file). Connection opens, ends, closes and
// losses pass through and are not counted. n <= 0 means no limit: s itself.
func Limit(s Sink, n int, done func()) Sink {
	if n <= 0 {
		return s
	}
	l := &limitSink{Sink: s, done: done}
	l.left.Store(int64(n))
	return l
}

type limitSink struct {
	Sink
	left atomic.Int64
	once sync.Once
	done func()
}

// Open implements Sink.
func (l *limitSink) Open(ci ConnInfo) Recording {
	return &limitRec{Recording: l.Sink.Open(ci), l: l}
}

// Dropped passes drop counts to the underlying sink, if it keeps them.
func (l *limitSink) Dropped(t time.Time, n uint64, comment string) {
	Dropped(l.Sink, t, n, comment)
}

type limitRec struct {
	Recording
	l *limitSink
}

func (r *limitRec) Data(dir Dir, t time.Time, p []byte, note string) {
	if len(p) == 0 {
		if note != "" && r.l.left.Load() > 0 {
			r.Recording.Data(dir, t, p, note)
		}
		return
	}
	left := r.l.left.Add(-1)
	if left < 0 {
		return
	}
	r.Recording.Data(dir, t, p, note)
	if left == 0 && r.l.done != nil {
		r.l.once.Do(r.l.done)
	}
}

// Lost passes lost bytes on while the limit is not reached.
func (r *limitRec) Lost(dir Dir, t time.Time, n int64) {
	if r.l.left.Load() > 0 {
		Lost(r.Recording, dir, t, n)
	}
}

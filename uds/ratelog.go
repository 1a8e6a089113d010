package uds

import (
	"sync"
	"time"
)

// rateLogEvery is the least time between two lines a rateLog lets through.
const rateLogEvery = time.Second

// rateLog lets through at most one log line a second and counts the lines
// it holds back, so that a flood (refused peers, rejected connections) costs
// a few lines that say how many were left out.
type rateLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether a line may be written now; if so, it also returns
// how many lines were held back since the last one.
func (r *rateLog) allow() (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); r.last.IsZero() || now.Sub(r.last) >= rateLogEvery {
		suppressed, r.suppressed, r.last = r.suppressed, 0, now
		return true, suppressed
	}
	r.suppressed++
	return false, 0
}

// flush returns (and forgets) the count of lines held back since the last
// one let through: for a final summary line.
func (r *rateLog) flush() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.suppressed
	r.suppressed = 0
	return n
}

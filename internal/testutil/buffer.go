package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent Write and String: for a child
// process's output (written by exec's copier goroutines) or an slog handler
// shared by server goroutines, read by the test. When Max is above zero,
// writes past Max bytes are dropped (still reported as written).
type Buffer struct {
	Max int // cap on what is kept; 0 = no cap

	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p (up to Max) and always reports len(p) written.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Max > 0 {
		if room := b.Max - b.b.Len(); room < len(p) {
			b.b.Write(p[:max(room, 0)])
			return len(p), nil
		}
	}
	b.b.Write(p)
	return len(p), nil
}

// String returns what was kept so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

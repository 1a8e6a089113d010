package testsvc

import (
	"bytes"
	"sync"
)

// lockedBuffer collects a child's output; written by exec's copier goroutines
// and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// maxOutput caps what is kept of a server's output.
const maxOutput = 1 << 20

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < maxOutput {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

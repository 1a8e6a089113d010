package frame

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
)

// gatherLog records each Write call's bytes.
type gatherLog struct {
	mu     sync.Mutex
	writes [][]byte
}

func (l *gatherLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.writes = append(l.writes, append([]byte(nil), p...))
	l.mu.Unlock()
	return len(p), nil
}

// gatherRound writes frame A; while A's writer is in Gather, a goroutine
// starts writing frame B. It returns the writes made.
func gatherRound(t *testing.T, gather bool) [][]byte {
	t.Helper()
	log := &gatherLog{}
	w := NewWriter(log)
	var wg sync.WaitGroup
	calls := 0
	w.Gather = func() bool {
		calls++
		if calls == 1 { // A's turn: B becomes runnable now
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.WriteFrame(&Header{Type: TypeRequest, ID: 2}, nil, []byte("B")); err != nil {
					t.Error(err)
				}
			}()
		}
		return gather
	}
	if err := w.WriteFrame(&Header{Type: TypeRequest, ID: 1}, nil, []byte("A")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return log.writes
}

// TestWriterGather: with Gather on, a frame that becomes ready while the
// first caller yields goes out in the same write; with Gather returning
// false the first caller writes at once, alone. On one P the yield runs the
// new goroutine first, except when the scheduler picks the global queue
// (one schedule in 61), so most rounds of 20 must gather.
func TestWriterGather(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	mostRoundsGather(t, "gather on", gatherRound)
	for range 20 {
		ws := gatherRound(t, false)
		if len(ws) == 0 || len(ws[0]) != HeaderSize+1 {
			t.Fatalf("gather off: first write %d bytes, want frame A alone (%d bytes)", len(ws[0]), HeaderSize+1)
		}
	}
}

// mostRoundsGather runs 20 gathering rounds: each must write both frames,
// and at least 15 in one write.
func mostRoundsGather(t *testing.T, name string, round func(*testing.T, bool) [][]byte) {
	t.Helper()
	frame := HeaderSize + 1
	gathered := 0
	for range 20 {
		ws := round(t, true)
		total := 0
		for _, b := range ws {
			total += len(b)
		}
		if total != 2*frame {
			t.Fatalf("%s: wrote %d bytes in %d writes, want both frames (%d bytes)", name, total, len(ws), 2*frame)
		}
		if len(ws) == 1 {
			gathered++
		}
	}
	if gathered < 15 {
		t.Fatalf("%s: both frames in one write in %d of 20 rounds, want at least 15", name, gathered)
	}
}

// gatherFrameRound starts a goroutine that writes frame B (runnable, not
// yet run: one P) and then writes frame A with GatherFrame (gather) or
// WriteFrame. It returns the writes made.
func gatherFrameRound(t *testing.T, gather bool) [][]byte {
	t.Helper()
	log := &gatherLog{}
	w := NewWriter(log)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.WriteFrame(&Header{Type: TypeRequest, ID: 2}, nil, []byte("B")); err != nil {
			t.Error(err)
		}
	})
	write := w.WriteFrame
	if gather {
		write = w.GatherFrame
	}
	if err := write(&Header{Type: TypeRequest, ID: 1}, nil, []byte("A")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return log.writes
}

// TestWriterGatherFrame: GatherFrame lets a goroutine about to write run
// first, so both frames go out in one write (most rounds: the scheduler
// picks the global queue one schedule in 61); WriteFrame writes its frame
// at once, alone, every round. Both on a writer without Gather.
func TestWriterGatherFrame(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	mostRoundsGather(t, "GatherFrame", gatherFrameRound)
	for range 20 {
		ws := gatherFrameRound(t, false)
		if len(ws) != 2 || len(ws[0]) != HeaderSize+1 {
			t.Fatalf("WriteFrame: %d writes (first %d bytes), want frame A alone then B", len(ws), len(ws[0]))
		}
	}
}

// TestWriterGatherFrameYield: GatherFrameYield reports a yield when it
// found no write in progress, and none when its frame joined a write under
// way (it returns without writing or yielding); both frames go out.
func TestWriterGatherFrameYield(t *testing.T) {
	g := &gateWriter{gate: make(chan struct{})}
	w := NewWriter(g)
	first := make(chan error, 1)
	go func() { // its write blocks in the gate: a write in progress
		_, err := w.GatherFrameYield(&Header{Type: TypeStreamData, ID: 1}, nil, []byte("A"))
		first <- err
	}()
	for {
		g.mu.Lock()
		started := g.started
		g.mu.Unlock()
		if started {
			break
		}
		runtime.Gosched()
	}
	yielded, err := w.GatherFrameYield(&Header{Type: TypeStreamData, ID: 2}, nil, []byte("B"))
	if err != nil || yielded {
		t.Fatalf("behind a write in progress: yielded %v, err %v; want no yield", yielded, err)
	}
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	yielded, err = w.GatherFrameYield(&Header{Type: TypeStreamData, ID: 3}, nil, []byte("C"))
	if err != nil || !yielded {
		t.Fatalf("on an idle writer: yielded %v, err %v; want a yield", yielded, err)
	}
	r := NewReader(bytes.NewReader(g.buf.Bytes()), 1<<10)
	for _, id := range []uint32{1, 2, 3} {
		h, err := r.ReadHeader()
		if err != nil || h.ID != id {
			t.Fatalf("frame %d: %+v, %v", id, h, err)
		}
		if _, err := r.ReadPayload(&h, nil); err != nil {
			t.Fatal(err)
		}
	}
}

package frame

import (
	"bytes"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

// TestWriterConcurrent writes frames of many sizes from many goroutines over
// a real unix socket and checks every frame arrives whole.
func TestWriterConcurrent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "w.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan map[uint32][]byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		r := NewReader(c, 0)
		m := map[uint32][]byte{}
		for {
			f, err := r.ReadFrame(nil)
			if err != nil {
				got <- m
				return
			}
			m[f.ID] = append([]byte(nil), f.Payload...)
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(c)
	var wg sync.WaitGroup
	const G, N = 8, 200
	for g := range G {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range N {
				id := uint32(g*N + i + 1)
				size := []int{0, 10, 1000, 40 << 10, 200 << 10}[i%5]
				p := bytes.Repeat([]byte{byte(id)}, size)
				h := Header{Type: TypeResponse, ID: id}
				if err := w.WriteFrame(&h, nil, p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.Close()
	m := <-got
	if len(m) != G*N {
		t.Fatalf("got %d frames, want %d", len(m), G*N)
	}
	for id, p := range m {
		i := int(id-1) % N
		size := []int{0, 10, 1000, 40 << 10, 200 << 10}[i%5]
		if len(p) != size || (size > 0 && p[0] != byte(id)) {
			t.Fatalf("frame %d: %d bytes", id, len(p))
		}
	}
}

// TestNoAllocsPerFrame: a steady-state write and read of a small frame
// allocate nothing.
func TestNoAllocsPerFrame(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	w := NewWriter(pw)
	r := NewReader(pr, 0)
	head := AppendRequestHead(nil, "echo", "k", "v")
	payload := make([]byte, 1024)
	buf := make([]byte, 0, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			h, err := r.ReadHeader()
			if err != nil {
				return
			}
			if _, err := r.ReadHead(&h); err != nil {
				return
			}
			if _, err := r.ReadPayload(&h, buf[:0]); err != nil {
				return
			}
		}
	}()
	allocs := testing.AllocsPerRun(1000, func() {
		h := Header{Type: TypeRequest, ID: 1}
		if err := w.WriteFrame(&h, head, payload); err != nil {
			t.Fatal(err)
		}
	})
	pw.Close()
	<-done
	if allocs > 0 {
		t.Fatalf("%.1f allocs per frame, want 0", allocs)
	}
}

func TestWriterStickyError(t *testing.T) {
	a, b := net.Pipe()
	b.Close()
	w := NewWriter(a)
	h := Header{Type: TypePing}
	if err := w.WriteFrame(&h, nil, nil); err == nil {
		t.Fatal("want error writing to a closed pipe")
	}
	if err := w.WriteFrame(&h, nil, nil); err == nil {
		t.Fatal("errors must be sticky")
	}
	w2 := NewWriter(io.Discard)
	w2.Fail(nil)
	if err := w2.WriteRaw([]byte("x")); err != ErrWriterClosed {
		t.Fatalf("got %v", err)
	}
}

// gateWriter blocks its first Write until gate is closed, then records
// everything written.
type gateWriter struct {
	gate    chan struct{}
	mu      sync.Mutex
	started bool
	buf     bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	first := !g.started
	g.started = true
	g.mu.Unlock()
	if first {
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

// TestWriterFIFO: writers that have to wait (a large frame behind a write in
// progress) go out in the order they started waiting, so no caller starves
// behind later arrivals (the 16-caller 1 MiB p99 problem).
func TestWriterFIFO(t *testing.T) {
	for round := range 5 {
		g := &gateWriter{gate: make(chan struct{})}
		w := NewWriter(g)
		big := make([]byte, w.LargePayload)
		first := make(chan error, 1)
		go func() {
			h := Header{Type: TypeResponse, ID: 1000}
			first <- w.WriteFrame(&h, nil, big)
		}()
		testutil.WaitFor(t, `w.Waiting() == 0 && !w.Idle()`, func() bool { return w.Waiting() == 0 && !w.Idle() })
		const N = 12
		var wg sync.WaitGroup
		for i := range N {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := Header{Type: TypeResponse, ID: uint32(i + 1)}
				if err := w.WriteFrame(&h, nil, big); err != nil {
					t.Error(err)
				}
			}()
			testutil.WaitFor(t, `w.Waiting() == i+1`, func() bool { return w.Waiting() == i+1 })
		}
		close(g.gate)
		wg.Wait()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		r := NewReader(bytes.NewReader(g.buf.Bytes()), 0)
		var order []uint32
		for {
			f, err := r.ReadFrame(nil)
			if err != nil {
				break
			}
			order = append(order, f.ID)
		}
		if len(order) != N+1 || order[0] != 1000 {
			t.Fatalf("round %d: frames %v", round, order)
		}
		for i, id := range order[1:] {
			if id != uint32(i+1) {
				t.Fatalf("round %d: waiting writers went out in the order %v, want 1..%d", round, order[1:], N)
			}
		}
	}
}

// failingDuringWrite is a stream whose Write succeeds while, meanwhile,
// somebody else fails the Writer (as the connection's reader does when it
// finds a protocol error).
type failingDuringWrite struct {
	w   *Writer
	buf bytes.Buffer
}

func (f *failingDuringWrite) Write(p []byte) (int, error) {
	f.w.Fail(errors.New("reader found a protocol error"))
	return f.buf.Write(p)
}

// TestWriteFrameReportsOwnWrite: a frame whose write went out is reported
// sent even if the writer was failed while it was being written; the
// failure is sticky for later frames.
func TestWriteFrameReportsOwnWrite(t *testing.T) {
	f := &failingDuringWrite{}
	w := NewWriter(f)
	f.w = w
	h := Header{Type: TypeRequest, ID: 1}
	if err := w.WriteFrame(&h, []byte{4, 0, 'e', 'c', 'h', 'o'}, []byte("x")); err != nil {
		t.Fatalf("the frame was written, but WriteFrame says %v", err)
	}
	if f.buf.Len() != HeaderSize+6+1 {
		t.Fatalf("%d bytes written", f.buf.Len())
	}
	if err := w.WriteFrame(&h, nil, nil); err == nil || !strings.Contains(err.Error(), "protocol error") {
		t.Fatalf("after Fail: %v, want the sticky error", err)
	}
}

// countingReader counts the bytes of reads asking for min..64 KiB (only
// ReadPayload's direct reads ask for that: bufio fills its whole 64 KiB
// buffer) and hands out at most chunk bytes per Read, so frames straddle the
// buffer at many offsets.
type countingReader struct {
	r          io.Reader
	chunk, min int
	big        int
}

func (c *countingReader) Read(p []byte) (int, error) {
	asked := len(p)
	if len(p) > c.chunk {
		p = p[:c.chunk]
	}
	n, err := c.r.Read(p)
	if asked >= c.min && asked < 64<<10 {
		c.big += n // bufio fills its 64 KiB buffer whole: this is a direct read
	}
	return n, err
}

// TestReadPayloadStraddlingBuffer: payloads larger than the buffer and with a
// rest beyond what is buffered arrive whole and in order, the frame after
// them intact, whatever the read sizes; the rest is read straight into the
// destination (not through the 64 KiB buffer).
func TestReadPayloadStraddlingBuffer(t *testing.T) {
	sizes := []int{100 << 10, 10, 70 << 10, 1 << 20, 0, 64 << 10, 80<<10 + 3, 5}
	var stream bytes.Buffer
	w := NewWriter(&stream)
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		h := Header{Type: TypeResponse, ID: uint32(i + 1)}
		if err := w.WriteFrame(&h, nil, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, chunk := range []int{1 << 20, 70 << 10, 33 << 10, 4096 + 7} {
		src := &countingReader{r: bytes.NewReader(stream.Bytes()), chunk: chunk, min: directMin}
		r := NewReader(src, 64<<10)
		for i, n := range sizes {
			h, err := r.ReadHeader()
			if err != nil || h.ID != uint32(i+1) || int(h.PayloadLen) != n {
				t.Fatalf("chunk %d frame %d: header %+v %v", chunk, i, h, err)
			}
			if _, err := r.ReadHead(&h); err != nil { // the large ones are padded
				t.Fatal(err)
			}
			p, err := r.ReadPayload(&h, make([]byte, 0, n))
			if err != nil || !bytes.Equal(p, bytes.Repeat([]byte{byte('a' + i)}, n)) {
				t.Fatalf("chunk %d frame %d: payload of %d bytes wrong (%v)", chunk, i, len(p), err)
			}
		}
		if _, err := r.ReadHeader(); err != io.EOF {
			t.Fatalf("chunk %d: after the last frame: %v, want io.EOF", chunk, err)
		}
		if src.big == 0 {
			t.Errorf("chunk %d: no payload rest was read straight into its destination", chunk)
		}
	}
}

// TestReadPayloadExactCapacity: a payload read into a buffer with no room
// grows step by step as bytes arrive and ends in a buffer of exactly its size
// (slices.Grow rounded a 1 MiB payload up past 1 MiB, so callers that pool
// buffers of up to 1 MiB dropped it and allocated again on every call).
func TestReadPayloadExactCapacity(t *testing.T) {
	for _, n := range []int{1, 40 << 10, 1 << 20, 3<<20 + 5} {
		var stream bytes.Buffer
		h := Header{Type: TypeResponse, ID: 1}
		if err := NewWriter(&stream).WriteFrame(&h, nil, bytes.Repeat([]byte("x"), n)); err != nil {
			t.Fatal(err)
		}
		r := NewReader(&stream, 0)
		h, err := r.ReadHeader()
		if err != nil {
			t.Fatal(err)
		}
		p, err := r.ReadPayload(&h, nil)
		if err != nil || len(p) != n {
			t.Fatalf("%d bytes: got %d, %v", n, len(p), err)
		}
		if cap(p) != n {
			t.Errorf("%d-byte payload read into a buffer of capacity %d, want exactly %d", n, cap(p), n)
		}
	}
}

// sizeLog records the size of each read that reaches the source.
type sizeLog struct {
	r     io.Reader
	sizes []int
}

func (s *sizeLog) Read(p []byte) (int, error) {
	s.sizes = append(s.sizes, len(p))
	return s.r.Read(p)
}

// TestFillCappedAfterLargePayload: after a payload larger than the buffer,
// the read that brings in the next header asks for at most maxFill bytes,
// so little of a next large payload takes the extra copy through the
// buffer; after a small frame, fills are not capped.
func TestFillCappedAfterLargePayload(t *testing.T) {
	var stream bytes.Buffer
	w := NewWriter(&stream)
	for i, n := range []int{100 << 10, 100 << 10, 10, 10} {
		h := Header{Type: TypeStreamData, ID: uint32(i + 1)}
		if err := w.WriteFrame(&h, nil, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	src := &sizeLog{r: &stream}
	r := NewReader(src, 64<<10)
	for i := range 4 {
		before := len(src.sizes)
		h, err := r.ReadHeader()
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 || i == 2 { // headers after a large payload
			for _, n := range src.sizes[before:] {
				if n > maxFill {
					t.Fatalf("frame %d: the read for its header asked for %d bytes, over maxFill %d", i, n, maxFill)
				}
			}
		}
		if _, err := r.ReadPayload(&h, nil); err != nil {
			t.Fatal(err)
		}
	}
	if src.sizes[0] != 64<<10 {
		t.Fatalf("first fill asked for %d bytes, want the whole 64 KiB buffer", src.sizes[0])
	}
}

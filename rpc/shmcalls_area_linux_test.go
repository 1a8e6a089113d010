package rpc

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
)

// inAnsArea returns k when b lies in slot k's payload area of the server's
// half, else -1.
func inAnsArea(x *clientCalls, b []byte) int {
	if len(b) == 0 {
		return -1
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for k := range shm.CallSlots {
		a := x.calls.AnsPayload(k)
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(a)) {
			return k
		}
	}
	return -1
}

// TestShmCallsPayloadAreas: payloads of the threshold up to 64 KiB travel
// in the call slots' payload areas (spec 10.8), both ways, with a copying
// and an in-place server: no payload slot is allocated or released for
// them (every byte counts in the area counters), while 64 KiB + 1 still
// goes in a payload slot. Echoes are byte for byte.
func TestShmCallsPayloadAreas(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		s := NewServer(ServerOptions{ShmInPlace: inPlace})
		s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
			return append(dst, req...), nil
		})
		c, _ := slotClient(t, startServer(t, s))
		echoes(t, c, 2, 64)
		before, sBefore, n0 := c.ShmStats(), s.ShmStats(), c.slotCallCount()
		for _, size := range []int{16 << 10, 40000, 64 << 10} {
			echoes(t, c, 40, size) // more calls than slots: each area is reused
		}
		after, sAfter := c.ShmStats(), s.ShmStats()
		if n := c.slotCallCount() - n0; n != 120 {
			t.Fatalf("in place %v: %d calls through call slots, want 120", inPlace, n)
		}
		// Each payload counts in Sent/Received, and all of its bytes in the
		// area counters: none went in a payload slot.
		area := uint64(40 * (16<<10 + 40000 + 64<<10))
		if after.Sent-before.Sent != 120 || after.Received-before.Received != 120 || sAfter.Sent-sBefore.Sent != 120 || sAfter.Received-sBefore.Received != 120 ||
			after.AreaSentBytes-before.AreaSentBytes != area || after.AreaReceivedBytes-before.AreaReceivedBytes != area ||
			sAfter.AreaSentBytes-sBefore.AreaSentBytes != area || sAfter.AreaReceivedBytes-sBefore.AreaReceivedBytes != area {
			t.Fatalf("in place %v: payloads up to 64 KiB did not all go in payload areas (%d bytes each way): client %+v -> %+v, server %+v -> %+v", inPlace, area, before, after, sBefore, sAfter)
		}
		echoes(t, c, 3, 64<<10+1)
		if st := c.ShmStats(); st.Sent != after.Sent+3 || st.Received != after.Received+3 || st.AreaSentBytes != after.AreaSentBytes {
			t.Fatalf("in place %v: 64 KiB + 1 did not go in payload slots: %+v -> %+v", inPlace, after, st)
		}
		waitFor(t, "every payload slot released", func() bool {
			return c.ShmStats().InUse == 0 && s.ShmStats().InUse == 0
		})
		c.Close()
	}
}

// TestShmCallsAreaViewHoldsSlot: a CallRawView of an answer in a payload
// area points into the server's area of its slot and holds that slot until
// Release: 100 more calls (from 16 callers) never reuse it, so the view's
// bytes stay the answer's; after Release the slot is free again.
func TestShmCallsAreaViewHoldsSlot(t *testing.T) {
	s := NewServer(ServerOptions{ShmInPlace: true})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	c, x := slotClient(t, startServer(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := pattern(64<<10, 77)
	v, err := c.CallRawView(ctx, "echo", want, nil)
	if err != nil || !v.InPlace() || !bytes.Equal(v.Bytes(), want) {
		t.Fatalf("view: %v (in place %v)", err, v.InPlace())
	}
	k := inAnsArea(x, v.Bytes())
	if k < 0 {
		t.Fatal("the view is not in a call slot's payload area")
	}
	if n := freeSlots(x); n != shm.CallSlots-1 {
		t.Fatalf("%d free slots while the view is held, want %d", n, shm.CallSlots-1)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 7 {
				req := pattern(64<<10, 1000+g*10+i)
				v2, err := c.CallRawView(ctx, "echo", req, nil)
				if err != nil || !bytes.Equal(v2.Bytes(), req) {
					t.Errorf("caller %d: %v", g, err)
				}
				if inAnsArea(x, v2.Bytes()) == k {
					t.Errorf("caller %d: an answer in the held slot %d", g, k)
				}
				v2.Release()
			}
		}()
	}
	wg.Wait()
	if !bytes.Equal(v.Bytes(), want) {
		t.Fatal("the held view's bytes changed: its slot was reused")
	}
	v.Release()
	v.Release() // a second Release does nothing
	if n := freeSlots(x); n != shm.CallSlots {
		t.Fatalf("%d free slots after Release, want %d", n, shm.CallSlots)
	}
}

// publishRaw publishes a request frame (head for method, payload, flags)
// in slot k as a hostile client would, past the client's own bookkeeping.
func publishRaw(x *clientCalls, k int, method string, payload []byte, flags uint8) {
	head := frame.AppendRequestHead(nil, method)
	h := frame.Header{Type: frame.TypeRequest, Flags: flags, ID: slotID(k, x.seq[k]+1), HeadLen: uint16(len(head)), PayloadLen: uint32(len(payload))}
	a := x.calls.ReqArea(k)
	h.Put(a)
	n := frame.HeaderSize + copy(a[frame.HeaderSize:], head)
	n += copy(a[n:], payload)
	x.calls.ReqLen(k).Store(uint32(n))
	x.calls.ReqSeq(k).Store(x.seq[k] + 1)
	x.calls.Bell().Add(1)
	shm.FutexWake(x.calls.Bell(), 1)
}

func areaDesc(off, n uint32) []byte {
	var b [shm.DescSize]byte
	shm.Desc{Off: off, Len: n}.Put(b[:])
	return b[:]
}

// TestShmCallsAreaHostile: a payload-area descriptor over the area, of
// length 0, naming another slot's area or a point inside its own, from a
// client or (for the length) from a server, fails that peer's connection
// with protocol_violation; the server keeps serving another client.
func TestShmCallsAreaHostile(t *testing.T) {
	s, addr, entered := slotServer(t)
	good, _ := slotClient(t, addr)
	reqCase := func(k int, off func(x *clientCalls) uint32, n uint32) func(t *testing.T, c *Client, x *clientCalls) {
		return func(t *testing.T, c *Client, x *clientCalls) {
			publishRaw(x, k, "echo", areaDesc(off(x), n), shm.FlagShm)
		}
	}
	own := func(k int) func(x *clientCalls) uint32 {
		return func(x *clientCalls) uint32 { return x.calls.PayloadOff(false, k) }
	}
	cases := []slotHostileCase{
		{"request area length over the area", reqCase(4, own(4), shm.PayloadAreaSize+1)},
		{"request area length 0", reqCase(4, own(4), 0)},
		{"request naming another slot's area", reqCase(4, own(5), 100)},
		{"request inside its area, not at its start", reqCase(4, func(x *clientCalls) uint32 { return x.calls.PayloadOff(false, 4) + 64 }, 100)},
		{"request naming the server's area", reqCase(4, func(x *clientCalls) uint32 { return x.calls.PayloadOff(true, 4) }, 100)},
		{"answer area length over the area", func(t *testing.T, c *Client, x *clientCalls) {
			answerInFlight(t, c, x, entered, func(k int, s uint32) {
				// The answer a hostile server would publish.
				h := frame.Header{Type: frame.TypeResponse, Flags: shm.FlagShm, ID: slotID(k, s), PayloadLen: shm.DescSize}
				a := x.calls.AnsArea(k)
				h.Put(a)
				copy(a[frame.HeaderSize:], areaDesc(x.calls.PayloadOff(true, k), shm.PayloadAreaSize+1))
				x.calls.AnsLen(k).Store(frame.HeaderSize + shm.DescSize)
			})
		}},
	}
	runSlotHostile(t, s, addr, good, 64<<10, true, cases)
}

// TestShmCallsAreaScribbler: a client that keeps rewriting its own
// payload areas while its calls are in flight (an in-place server reads
// them there) corrupts only its own answers: its connection stays up, a
// second client's echoes are all right meanwhile, and once it stops its
// own echoes are right again.
func TestShmCallsAreaScribbler(t *testing.T) {
	s := NewServer(ServerOptions{ShmInPlace: true})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, req...), nil
	})
	addr := startServer(t, s)
	bad, x := slotClient(t, addr)
	good, _ := slotClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the scribbler: every area of the client's half, over and over
		defer wg.Done()
		for i := 0; !stop.Load() && i < 1_000_000; i++ {
			a := x.calls.ReqPayload(i % shm.CallSlots)
			for j := 0; j < len(a); j += 4096 {
				a[j] ^= 0xFF
			}
		}
	}()
	var badCalls atomic.Int64
	go func() { // the scribbler's own calls: answers may differ, errors may not occur
		defer wg.Done()
		for i := 0; i < 200 && !stop.Load(); i++ {
			if _, err := bad.CallRaw(ctx, "echo", pattern(64<<10, i), nil); err != nil {
				t.Errorf("the scribbling client's call failed: %v", err)
				return
			}
			badCalls.Add(1)
		}
	}()
	echoes(t, good, 100, 64<<10)
	stop.Store(true)
	wg.Wait()
	if badCalls.Load() == 0 {
		t.Fatal("the scribbling client made no call")
	}
	echoes(t, bad, 40, 64<<10)
	echoes(t, good, 10, 64<<10)
}

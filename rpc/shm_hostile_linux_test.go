package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/uds"
)

// rawShmClient is a hand-driven client for hostile-peer tests.
type rawShmClient struct {
	t      *testing.T
	uc     *net.UnixConn
	region *shm.Region // its own mapping of what it offered (nil if none)
}

// rawDial connects and exchanges hellos with the shm flag set.
func rawDial(t *testing.T, addr string) *rawShmClient {
	t.Helper()
	a, err := uds.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("unix", a.SockaddrName())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	uc := nc.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(20 * time.Second))
	var hb [frame.HelloSize]byte
	(&frame.Hello{Version: 1, Flags: frame.FeatureStreamCredit | shm.FeatureShm, MaxFrame: frame.DefaultMaxFrame}).Put(hb[:])
	if _, err := uc.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(uc, hb[:]); err != nil {
		t.Fatal(err)
	}
	if h, err := frame.ParseHello(hb[:]); err != nil || h.Flags&shm.FeatureShm == 0 {
		t.Fatalf("server hello %+v %v: no shm flag", h, err)
	}
	return &rawShmClient{t: t, uc: uc}
}

// offer sends an offer of size with fds attached and returns the 16 bytes
// the server answers.
func (c *rawShmClient) offer(size uint64, fds ...int) []byte {
	c.t.Helper()
	b := shm.AppendOffer(nil, size)
	var err error
	if len(fds) == 0 {
		_, err = c.uc.Write(b)
	} else {
		err = uds.SendFDs(c.uc, b, fds)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	ans := make([]byte, 16)
	if _, err := io.ReadFull(c.uc, ans); err != nil {
		c.t.Fatalf("reading the answer: %v", err)
	}
	return ans
}

// accepted offers a proper region and expects it accepted.
func (c *rawShmClient) accepted() {
	c.t.Helper()
	r, fd, err := shm.Create(shm.MinRegion * 8) // 1 MiB
	if err != nil {
		c.t.Fatal(err)
	}
	defer shm.CloseFD(fd)
	c.t.Cleanup(r.Close)
	r.Acquire()
	c.t.Cleanup(r.Release)
	c.region = r
	if ok, err := shm.ParseAnswer(c.offer(r.Size(), fd)); err != nil || !ok {
		c.t.Fatalf("offer not accepted: %v %v", ok, err)
	}
}

func (c *rawShmClient) write(typ frame.Type, flags uint8, id uint32, head, payload []byte) {
	c.t.Helper()
	h := frame.Header{Type: typ, Flags: flags, ID: id, HeadLen: uint16(len(head)), PayloadLen: uint32(len(payload))}
	b := h.Append(nil)
	b = append(append(b, head...), payload...)
	if _, err := c.uc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawShmClient) shmRequest(id uint32, method string, d shm.Desc) {
	var p [8]byte
	d.Put(p[:])
	c.write(frame.TypeRequest, shm.FlagShm, id, frame.AppendRequestHead(nil, method), p[:])
}

// readFrame reads one frame (header, head, payload).
func (c *rawShmClient) readFrame() (frame.Header, []byte, []byte, error) {
	var hb [16]byte
	if _, err := io.ReadFull(c.uc, hb[:]); err != nil {
		return frame.Header{}, nil, nil, err
	}
	h := frame.ParseHeader(hb[:])
	head := make([]byte, h.HeadLen)
	payload := make([]byte, h.PayloadLen)
	if _, err := io.ReadFull(c.uc, head); err != nil {
		return h, nil, nil, err
	}
	_, err := io.ReadFull(c.uc, payload)
	return h, head, payload, err
}

// expectViolation reads until the server's connection error and EOF.
func (c *rawShmClient) expectViolation(want string) {
	c.t.Helper()
	for {
		h, head, _, err := c.readFrame()
		if err != nil {
			c.t.Fatalf("connection ended without a protocol_violation error frame: %v", err)
		}
		if h.Type == frame.TypeError && h.ID == 0 {
			if Code(h.Aux) != ProtocolViolation || !strings.Contains(string(head), want) {
				c.t.Fatalf("connection error %d %q, want protocol_violation mentioning %q", h.Aux, head, want)
			}
			break
		}
	}
	if _, _, _, err := c.readFrame(); err == nil {
		c.t.Fatal("the connection stayed open after its protocol violation")
	}
}

// shmVictim is an echo server plus a check that it keeps serving a
// well-behaved shared-memory client.
func shmVictim(t *testing.T) (addr string, s *Server, stillServes func()) {
	s = echoServer()
	addr = startServer(t, s)
	good := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1})
	stillServes = func() {
		t.Helper()
		req := pattern(200<<10, 9)
		resp, err := good.CallRaw(context.Background(), "echo", req, nil)
		if err != nil || !bytes.Equal(resp, req) {
			t.Fatalf("the server stopped serving others: %v", err)
		}
		if good.ShmStats().Conns != 1 {
			t.Fatal("the good client lost shared memory")
		}
	}
	stillServes()
	return addr, s, stillServes
}

func sealedMemfd(t *testing.T, size int64, seals int) int {
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// TestShmHostileOffers: bad regions are refused before anything is mapped;
// the connection fails with protocol_violation, the server serves others.
func TestShmHostileOffers(t *testing.T) {
	addr, _, stillServes := shmVictim(t)
	const S = shm.MinRegion
	good := func() int { return sealedMemfd(t, S, shm.RequiredSeals) }
	for _, tc := range []struct {
		name, want string
		size       uint64
		fds        func() []int
	}{
		{"unsealed memfd", "not sealed", S, func() []int { return []int{sealedMemfd(t, S, 0)} }},
		{"shrinkable memfd", "not sealed", S, func() []int { return []int{sealedMemfd(t, S, unix.F_SEAL_GROW|unix.F_SEAL_SEAL)} }},
		{"size differs from the offer", "bytes, the offer says", S, func() []int { return []int{sealedMemfd(t, 2*S, shm.RequiredSeals)} }},
		{"two memfds", "descriptors came with the offer", S, func() []int { return []int{good(), good()} }},
		{"a pipe", "not a memfd", S, func() []int {
			var p [2]int
			unix.Pipe2(p[:], unix.O_CLOEXEC)
			t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
			return []int{p[0]}
		}},
		{"bad size", "region size", S + 4096, func() []int { return []int{good()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, addr)
			b := shm.AppendOffer(nil, tc.size)
			if err := uds.SendFDs(c.uc, b, tc.fds()); err != nil {
				t.Fatal(err)
			}
			c.expectViolation(tc.want)
			stillServes()
		})
	}
}

// TestShmOfferWithoutDescriptorDeclined: an offer whose descriptor was lost
// (a byte relay between the peers) is declined and the connection goes on
// over the socket.
func TestShmOfferWithoutDescriptorDeclined(t *testing.T) {
	addr, _, _ := shmVictim(t)
	c := rawDial(t, addr)
	ok, err := shm.ParseAnswer(c.offer(shm.MinRegion))
	if err != nil || ok {
		t.Fatalf("answer %v %v, want declined", ok, err)
	}
	c.write(frame.TypeRequest, 0, 1, frame.AppendRequestHead(nil, "echo"), []byte("hi"))
	h, _, p, err := c.readFrame()
	if err != nil || h.Type != frame.TypeResponse || string(p) != "hi" {
		t.Fatalf("%+v %q %v", h, p, err)
	}
	// and a descriptor on it is a violation
	c.shmRequest(2, "echo", shm.Desc{Off: 0, Len: 10})
	c.expectViolation("without shared memory")
}

// TestShmHostileDescriptors: descriptors out of the sender's half, past the
// region, of a wrong size, releases of slots never handed over, a second
// offer: each fails that connection only, with no fault.
func TestShmHostileDescriptors(t *testing.T) {
	addr, _, stillServes := shmVictim(t)
	const S = 8 * shm.MinRegion
	for _, tc := range []struct {
		name, want string
		send       func(c *rawShmClient)
	}{
		{"offset past the region", "outside the sender's half", func(c *rawShmClient) { c.shmRequest(1, "echo", shm.Desc{Off: S + 4096, Len: 10}) }},
		{"offset+length wraps", "outside the sender's half", func(c *rawShmClient) { c.shmRequest(1, "echo", shm.Desc{Off: 0xFFFFFFF0, Len: 0x100}) }},
		{"slot crossing into the server's half", "outside the sender's half", func(c *rawShmClient) { c.shmRequest(1, "echo", shm.Desc{Off: S/2 - 10, Len: 100}) }},
		{"slot overlapping the server's slots", "outside the sender's half", func(c *rawShmClient) { c.shmRequest(1, "echo", shm.Desc{Off: S / 2, Len: 100}) }},
		{"length 0", "length 0", func(c *rawShmClient) { c.shmRequest(1, "echo", shm.Desc{Off: 0, Len: 0}) }},
		{"descriptor of 7 bytes", "descriptor payload", func(c *rawShmClient) {
			c.write(frame.TypeRequest, shm.FlagShm, 1, frame.AppendRequestHead(nil, "echo"), make([]byte, 7))
		}},
		{"descriptor to an unknown method", "outside the sender's half", func(c *rawShmClient) { c.shmRequest(1, "nope", shm.Desc{Off: S, Len: 1}) }},
		{"release of a slot never handed over", "not a slot handed over", func(c *rawShmClient) {
			c.write(frame.Type(shm.TypeRelease), 0, 0, nil, shm.AppendRelease(nil, shm.Desc{Off: S / 2, Len: 4096})[16:])
		}},
		{"release with an id", "id 3", func(c *rawShmClient) {
			c.write(frame.Type(shm.TypeRelease), 0, 3, nil, shm.AppendRelease(nil, shm.Desc{Off: S / 2, Len: 4096})[16:])
		}},
		{"a second offer", "shm_offer after", func(c *rawShmClient) { c.write(frame.Type(shm.TypeOffer), 0, 0, nil, make([]byte, 8)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawDial(t, addr)
			c.accepted()
			// one good call first: the descriptor path works on this connection
			copy(c.region.Bytes(shm.Desc{Off: 0, Len: 5}), "hello")
			c.shmRequest(7, "echo", shm.Desc{Off: 0, Len: 5})
			gotResp, gotRel := false, false
			for !gotResp || !gotRel {
				h, _, p, err := c.readFrame()
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case h.Type == frame.TypeResponse && string(p) == "hello":
					gotResp = true
				case h.Type == frame.Type(shm.TypeRelease) && bytes.Equal(p, shm.AppendRelease(nil, shm.Desc{Off: 0, Len: 5})[16:]):
					gotRel = true
				default:
					t.Fatalf("unexpected %+v %q", h, p)
				}
			}
			tc.send(c)
			c.expectViolation(tc.want)
			stillServes()
		})
	}
}

// TestShmRewriteAfterHandOver: a client that keeps rewriting its slot after
// handing it over changes nothing the handler sees: the server copies the
// request out before it releases the slot, so the handler's bytes are
// private, and the server keeps serving everyone.
func TestShmRewriteAfterHandOver(t *testing.T) {
	s := NewServer(ServerOptions{})
	changed := make(chan bool, 1)
	s.HandleRaw("hold", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		snap := append([]byte(nil), req...)
		time.Sleep(100 * time.Millisecond) // the client scribbles meanwhile
		changed <- !bytes.Equal(snap, req)
		return append(dst, req[:8]...), nil
	})
	addr := startServer(t, s)
	c := rawDial(t, addr)
	c.accepted()
	d := shm.Desc{Off: 0, Len: 64 << 10}
	slot := c.region.Bytes(d)
	copy(slot, pattern(len(slot), 1))
	c.shmRequest(1, "hold", d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the hostile part: rewrite the handed-over slot, hard
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(slot[(i*8)%len(slot):], uint64(i))
		}
	}()
	var gotRel bool
	for done := false; !done; {
		h, _, _, err := c.readFrame()
		if err != nil {
			t.Fatal(err)
		}
		gotRel = gotRel || h.Type == frame.Type(shm.TypeRelease)
		done = h.Type == frame.TypeResponse
	}
	close(stop)
	wg.Wait()
	if !gotRel {
		t.Fatal("the server answered without releasing the request's slot")
	}
	if <-changed {
		t.Fatal("the handler's request bytes changed under it: the server read the region in place")
	}
	good := dial(t, addr)
	req := pattern(100<<10, 5)
	if resp, err := good.CallRaw(context.Background(), "hold", req, nil); err != nil || !bytes.Equal(resp, req[:8]) {
		t.Fatalf("the server stopped serving others: %v", err)
	}
}

// fakeShmServer accepts one connection from a real Client on a fresh
// socket, does the shared-memory handshake by hand (mapping the client's
// region), reads one request and then runs misbehave.
func fakeShmServer(t *testing.T, misbehave func(uc *net.UnixConn, region *shm.Region, reqID uint32)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		uc, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer uc.Close()
		var hb [16]byte
		if _, err := io.ReadFull(uc, hb[:]); err != nil {
			return
		}
		(&frame.Hello{Version: 1, Flags: frame.FeatureStreamCredit | shm.FeatureShm, MaxFrame: frame.DefaultMaxFrame, MaxInFlight: 64}).Put(hb[:])
		uc.Write(hb[:])
		buf := make([]byte, shm.OfferSize)
		n, fds, err := uds.RecvFDs(uc, buf, 1)
		if err != nil || n != shm.OfferSize || len(fds) != 1 {
			t.Errorf("fake server: offer %d bytes, %d fds, %v", n, len(fds), err)
			return
		}
		size, _ := shm.ParseOffer(buf)
		region, err := shm.OpenOffer(fds[0], size)
		shm.CloseFD(fds[0])
		if err != nil {
			t.Errorf("fake server: %v", err)
			return
		}
		defer region.Close()
		uc.Write(shm.AppendAnswer(nil, true))
		var h [16]byte
		if _, err := io.ReadFull(uc, h[:]); err != nil {
			return
		}
		fh := frame.ParseHeader(h[:])
		io.CopyN(io.Discard, uc, int64(fh.HeadLen)+int64(fh.PayloadLen))
		region.Acquire()
		defer region.Release()
		misbehave(uc, region, fh.ID)
		io.Copy(io.Discard, uc) // until the client closes
	}()
	return "unix:" + path
}

func writeFrame(uc *net.UnixConn, typ frame.Type, flags uint8, id uint32, payload []byte) {
	h := frame.Header{Type: typ, Flags: flags, ID: id, PayloadLen: uint32(len(payload))}
	uc.Write(append(h.Append(nil), payload...))
}

// TestShmHostileServer: a server that answers with a slot in the client's
// half, past the region, or releases a slot it never got fails the call
// and that connection with protocol_violation; the client never faults.
func TestShmHostileServer(t *testing.T) {
	desc := func(off, n uint32) []byte {
		var p [8]byte
		shm.Desc{Off: off, Len: n}.Put(p[:])
		return p[:]
	}
	for _, tc := range []struct {
		name      string
		misbehave func(uc *net.UnixConn, r *shm.Region, id uint32)
	}{
		{"response slot in the client's half", func(uc *net.UnixConn, r *shm.Region, id uint32) {
			writeFrame(uc, frame.TypeResponse, shm.FlagShm, id, desc(0, 100))
		}},
		{"response slot past the region", func(uc *net.UnixConn, r *shm.Region, id uint32) {
			writeFrame(uc, frame.TypeResponse, shm.FlagShm, id, desc(uint32(r.Size())-10, 100))
		}},
		{"descriptor of 12 bytes", func(uc *net.UnixConn, r *shm.Region, id uint32) {
			writeFrame(uc, frame.TypeResponse, shm.FlagShm, id, make([]byte, 12))
		}},
		{"release of a slot never handed over", func(uc *net.UnixConn, r *shm.Region, id uint32) {
			writeFrame(uc, frame.Type(shm.TypeRelease), 0, 0, desc(8192, 5))
		}},
		{"a shm_offer after the handshake", func(uc *net.UnixConn, r *shm.Region, id uint32) {
			writeFrame(uc, frame.Type(shm.TypeOffer), 0, 0, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeShmServer(t, tc.misbehave)
			c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, NoReconnect: true})
			if c.ShmStats().Conns != 1 {
				t.Fatal("no shared memory with the fake server")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := c.CallRaw(ctx, "echo", pattern(64<<10, 1), nil)
			var e *Error
			if !errors.As(err, &e) || e.Code != ProtocolViolation {
				t.Fatalf("call: %v, want protocol_violation", err)
			}
		})
	}
}

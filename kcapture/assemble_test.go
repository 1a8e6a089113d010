package kcapture

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

// encodeChunk encodes a chunk the way bpf/udscap.c lays it out.
func encodeChunk(c Chunk) []byte {
	b := make([]byte, headerLen, headerLen+len(c.Data))
	le := binary.NativeEndian
	le.PutUint64(b[0:], c.Mono)
	le.PutUint64(b[8:], c.Sock)
	le.PutUint64(b[16:], c.Peer)
	le.PutUint64(b[24:], c.Inode)
	le.PutUint64(b[32:], c.PeerInode)
	le.PutUint32(b[40:], c.PID)
	le.PutUint32(b[44:], c.TID)
	le.PutUint32(b[48:], c.UID)
	le.PutUint32(b[52:], c.GID)
	le.PutUint32(b[56:], c.FD)
	le.PutUint32(b[60:], c.Len)
	le.PutUint32(b[64:], c.Off)
	le.PutUint32(b[68:], c.Covered)
	le.PutUint16(b[72:], c.NFDs)
	b[74], b[75], b[76] = c.SockType, c.Flags, byte(c.Kind)
	copy(b[80:96], c.Comm)
	le.PutUint32(b[96:], c.PeerPID)
	le.PutUint32(b[100:], c.PeerUID)
	le.PutUint32(b[104:], c.PeerGID)
	le.PutUint32(b[108:], c.BoundDev)
	le.PutUint64(b[112:], c.BoundIno)
	le.PutUint64(b[120:], c.StreamOff)
	return append(b, c.Data...)
}

func TestParseChunkRoundTrip(t *testing.T) {
	in := Chunk{Mono: 7, Sock: 1, Peer: 2, Inode: 3, PeerInode: 4, PID: 5, TID: 6, UID: 8, GID: 9, FD: 10,
		Len: 100, Off: 40, Covered: 5, NFDs: 2, SockType: SockStream, Flags: flagRecv, Kind: KindRecvmsg, Comm: "psql", PeerPID: 11, PeerUID: 12, PeerGID: 13, BoundIno: 14, BoundDev: 15, StreamOff: 16, Data: []byte("hello")}
	out, err := ParseChunk(encodeChunk(in))
	if err != nil {
		t.Fatal(err)
	}
	if out.Comm != "psql" || !bytes.Equal(out.Data, in.Data) || out.Off != 40 || out.Kind != KindRecvmsg || !out.Recv() || out.NFDs != 2 || out.PeerPID != 11 || out.PeerGID != 13 || out.BoundIno != 14 || out.BoundDev != 15 || out.StreamOff != 16 {
		t.Errorf("round trip: %+v", out)
	}
	// Ring-buffer padding after the data is ignored.
	if out, err := ParseChunk(append(encodeChunk(in), 0, 0, 0)); err != nil || string(out.Data) != "hello" {
		t.Errorf("padded: %q %v", out.Data, err)
	}
	bad := in
	bad.Off = 99 // beyond Len
	if _, err := ParseChunk(encodeChunk(bad)); err == nil {
		t.Error("chunk beyond its message accepted")
	}
	if _, err := ParseChunk(encodeChunk(in)[:headerLen+2]); err == nil {
		t.Error("short data accepted")
	}
}

func FuzzParseChunk(f *testing.F) {
	f.Add(encodeChunk(Chunk{Len: 5, Covered: 5, Data: []byte("hello")}))
	f.Add(encodeChunk(Chunk{Len: 5, Covered: 5, Flags: flagFault}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseChunk(b)
		if err != nil {
			return
		}
		if uint64(c.Off)+uint64(c.Covered) > uint64(c.Len) || len(c.Data) > len(b) {
			t.Fatalf("inconsistent chunk accepted: %+v", c)
		}
		a := Assembler{Snaplen: 1 << 20, Emit: func(m *Message) {
			var n int64
			for _, p := range m.Pieces {
				n += int64(len(p.Data)) + p.Lost
			}
			if n > int64(m.Len) {
				t.Fatalf("message covers %d bytes, longer than %d", n, m.Len)
			}
		}}
		a.Add(&c)
		a.Flush()
	})
}

// Chunks of one message are joined; a missing chunk is a lost piece; bytes
// beyond the snap length are lost; a new message on the thread ends the old.
func TestAssembler(t *testing.T) {
	var got []*Message
	a := Assembler{Snaplen: 10, Emit: func(m *Message) { got = append(got, m) }}
	add := func(c Chunk) { a.Add(&c) }
	add(Chunk{TID: 1, Mono: 1, Len: 6, Off: 0, Covered: 3, Data: []byte("abc")})
	add(Chunk{TID: 1, Mono: 1, Len: 6, Off: 3, Covered: 3, Data: []byte("def")})
	// 20 bytes, snaplen 10: 10 captured, 10 lost.
	add(Chunk{TID: 2, Mono: 2, Len: 20, Off: 0, Covered: 10, Data: []byte("0123456789")})
	// Middle chunk lost; then the thread's next message ends this one.
	add(Chunk{TID: 3, Mono: 3, Len: 9, Off: 0, Covered: 3, Data: []byte("xxx")})
	add(Chunk{TID: 3, Mono: 3, Len: 9, Off: 6, Covered: 3, Data: []byte("zzz")})
	// A fault chunk: counted, no data.
	add(Chunk{TID: 4, Mono: 4, Len: 4, Off: 0, Covered: 4, Flags: flagFault})
	add(Chunk{TID: 5, Mono: 5, Len: 8, Off: 0, Covered: 4, Data: []byte("half")})
	a.Flush()
	if len(got) != 5 {
		t.Fatalf("%d messages, want 5", len(got))
	}
	want := []struct {
		data string
		lost int64
	}{{"abcdef", 0}, {"0123456789", 10}, {"xxxzzz", 3}, {"", 4}, {"half", 4}}
	for i, w := range want {
		var data []byte
		for _, p := range got[i].Pieces {
			data = append(data, p.Data...)
		}
		if string(data) != w.data || got[i].LostBytes() != w.lost {
			t.Errorf("message %d: %q lost %d, want %q lost %d", i, data, got[i].LostBytes(), w.data, w.lost)
		}
	}
}

// TestAssemblerReuse: a message's run is allocated once for the whole
// message (no regrowth as chunks arrive), and after Release its buffer
// carries the next message without touching what was copied out before.
func TestAssemblerReuse(t *testing.T) {
	var got []*Message
	a := &Assembler{Snaplen: 1 << 20, Emit: func(m *Message) { got = append(got, m) }}
	src := bytes.Repeat([]byte("abcdefgh"), 1024) // 8 KiB in two 4 KiB chunks
	a.Add(&Chunk{Mono: 1, TID: 1, Len: 8192, Off: 0, Covered: 4096, Data: src[:4096]})
	first := got
	if len(first) != 0 {
		t.Fatal("emitted after half a message")
	}
	a.Add(&Chunk{Mono: 1, TID: 1, Len: 8192, Off: 4096, Covered: 4096, Data: src[4096:]})
	if len(got) != 1 || len(got[0].Pieces) != 1 || !bytes.Equal(got[0].Pieces[0].Data, src) {
		t.Fatalf("message 1: %+v", got)
	}
	b1 := got[0].Pieces[0].Data
	if cap(b1) != 8192 {
		t.Errorf("run capacity %d, want the message's 8192 at once", cap(b1))
	}
	kept := append([]byte(nil), b1...)
	a.Release(got[0])
	if got[0].Pieces[0].Data != nil {
		t.Error("Release left the data in the message")
	}
	other := bytes.Repeat([]byte("Z"), 100)
	a.Add(&Chunk{Mono: 2, TID: 1, Len: 100, Off: 0, Covered: 100, Data: other})
	if len(got) != 2 || !bytes.Equal(got[1].Pieces[0].Data, other) {
		t.Fatalf("message 2: %+v", got[1])
	}
	if &got[1].Pieces[0].Data[:1][0] != &b1[:1][0] {
		t.Error("the released buffer was not reused")
	}
	if !bytes.Equal(kept, src) {
		t.Error("a copy taken before Release changed")
	}
}

// A whole message added in place is emitted with the caller's bytes (no
// copy), finishes the thread's earlier partial message, and Release does
// not take those bytes as a buffer to reuse.
func TestAssemblerAddWhole(t *testing.T) {
	var got []*Message
	a := &Assembler{Snaplen: 1 << 20, Emit: func(m *Message) { got = append(got, m) }}
	a.Add(&Chunk{TID: 1, Mono: 1, Len: 10, Off: 0, Covered: 4, Data: []byte("abcd")})
	ring := []byte("0123456789")
	c := Chunk{TID: 1, Mono: 2, Len: 10, Off: 0, Covered: 10, Data: ring}
	if !Whole(&c) {
		t.Fatal("Whole = false for a one-chunk message")
	}
	if Whole(&Chunk{Len: 10, Off: 0, Covered: 4, Data: ring[:4]}) || Whole(&Chunk{Len: 10, Covered: 10, Flags: flagFault}) {
		t.Fatal("Whole = true for a partial or faulted chunk")
	}
	a.AddWhole(&c, 7)
	if len(got) != 2 {
		t.Fatalf("%d messages, want 2 (the partial one finished first)", len(got))
	}
	if got[0].LostBytes() != 6 {
		t.Errorf("partial message lost %d bytes, want 6", got[0].LostBytes())
	}
	m := got[1]
	if m.hold != 7 || len(m.Pieces) != 1 || &m.Pieces[0].Data[0] != &ring[0] {
		t.Fatalf("in-place message: hold %d, pieces %v", m.hold, m.Pieces)
	}
	a.Release(m)
	if len(a.free) != 0 || m.Pieces[0].Data != nil {
		t.Fatalf("Release kept the ring's bytes: %d free buffers", len(a.free))
	}
}

// The reorder window releases in timestamp order, also after pushes out of
// order into a list it had sorted, and only up to the cutoff.
func TestReorderOrder(t *testing.T) {
	var out []uint64
	r := &reorder{emit: func(m *Message) { out = append(out, m.Mono) }}
	push := func(monos ...uint64) {
		for _, v := range monos {
			r.push(&Message{Chunk: Chunk{Mono: v}})
		}
	}
	push(30, 10, 20)
	r.drain(15)
	push(40, 25, 50)
	r.drain(45)
	r.flush()
	want := []uint64{10, 20, 25, 30, 40, 50}
	if !slices.Equal(out, want) {
		t.Fatalf("released %v, want %v", out, want)
	}
}

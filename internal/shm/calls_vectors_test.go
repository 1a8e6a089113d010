package shm

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

type callsVec struct {
	FeatureFlag       uint8 `json:"feature_flag"`
	ControlBlock      int   `json:"control_block"`
	Slots             int   `json:"slots"`
	Line0             int   `json:"line0"`
	Line              int   `json:"line"`
	Area0             int   `json:"area0"`
	AreaSize          int   `json:"area_size"`
	OffBell           int   `json:"off_bell"`
	OffServerSleeping int   `json:"off_server_sleeping"`
	OffSeq            int   `json:"off_seq"`
	OffLen            int   `json:"off_len"`
	OffSleeping       int   `json:"off_sleeping"`
	BellFeatureFlag   uint8 `json:"bell_feature_flag"`
	OffCBell          int   `json:"off_cbell"`
	OffCSleeping      int   `json:"off_csleeping"`
	MaxNapMS          int   `json:"max_nap_ms"`
	PayloadArea0      int   `json:"payload_area0"`
	PayloadAreaSize   int   `json:"payload_area_size"`
	Reserved          int   `json:"reserved"`
	AreaRegionSize    int   `json:"area_region_size"`
	AreaDescs         []struct {
		Name, Sender, Hex, Error string
		K                        int
		Area, OK                 bool
	} `json:"area_descs"`
	Negotiate []struct {
		Name, Client, Server string
		Calls, Bell          bool
	}
}

func loadCallsVectors(t testing.TB) *callsVec {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Calls callsVec }
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return &v.Calls
}

// TestVectorCallsLayout: the control block's constants, and where the
// words and areas of the first and last slot fall, agree with shm.json.
func TestVectorCallsLayout(t *testing.T) {
	v := loadCallsVectors(t)
	if v.FeatureFlag != FeatureShmCalls || v.ControlBlock != CallsBlock || v.Slots != CallSlots || v.Line0 != CallLine0 ||
		v.Line != CallLine || v.Area0 != CallArea0 || v.AreaSize != CallAreaSize || v.OffBell != OffBell ||
		v.OffServerSleeping != OffServerSleeping || v.OffSeq != OffSeq || v.OffLen != OffLen || v.OffSleeping != OffSleeping ||
		v.BellFeatureFlag != FeatureShmCallsBell || v.OffCBell != OffCBell || v.OffCSleeping != OffCSleeping ||
		v.MaxNapMS != 10 || v.PayloadArea0 != PayloadArea0 || v.PayloadAreaSize != PayloadAreaSize || v.Reserved != CallsReserved {
		t.Fatalf("call-slot constants differ from shm.json: %+v", v)
	}
	// The layout fits the block, lines and areas apart.
	if v.Line0+v.Slots*v.Line > v.Area0 || v.Area0+v.Slots*v.AreaSize > v.ControlBlock {
		t.Fatalf("the layout overflows: lines end at %d, areas at %d, block %d", v.Line0+v.Slots*v.Line, v.Area0+v.Slots*v.AreaSize, v.ControlBlock)
	}
	// Offsets computed by Calls on a real region.
	const size = 8 << 20
	r := &Region{mem: make([]byte, size), size: size}
	c := NewCalls(r)
	base := func(b []byte) int { return int(uintptrOf(b)) - int(uintptrOf(r.mem)) }
	if got := base(c.ReqArea(CallSlots - 1)); got != v.Area0+(v.Slots-1)*v.AreaSize {
		t.Fatalf("last request area at %d", got)
	}
	if got := base(c.AnsArea(0)); got != size/2+v.Area0 {
		t.Fatalf("first answer area at %d", got)
	}
	if got := int(uintptrOfWord(c.AnsLen(2))) - int(uintptrOf(r.mem)); got != size/2+v.Line0+2*v.Line+v.OffLen {
		t.Fatalf("slot 2's ans_len at %d", got)
	}
	if got := int(uintptrOfWord(c.CallerSleeping(31))) - int(uintptrOf(r.mem)); got != v.Line0+31*v.Line+v.OffSleeping {
		t.Fatalf("slot 31's sleeping at %d", got)
	}
	if got := int(uintptrOfWord(c.ServerSleeping())) - int(uintptrOf(r.mem)); got != size/2+v.OffServerSleeping {
		t.Fatalf("the server's sleeping word at %d", got)
	}
	// The client's bell and its sleeping word: server and client half.
	if got := int(uintptrOfWord(c.CBell())) - int(uintptrOf(r.mem)); got != size/2+v.OffCBell {
		t.Fatalf("cbell at %d", got)
	}
	if got := int(uintptrOfWord(c.CSleeping())) - int(uintptrOf(r.mem)); got != v.OffCSleeping {
		t.Fatalf("csleeping at %d", got)
	}
	// Both lie in the gap between the block's other words and the lines,
	// each on a 64-byte line of its own.
	for _, o := range []int{v.OffCBell, v.OffCSleeping} {
		if o < v.OffServerSleeping+64 || o+4 > v.Line0 || o%64 != 0 {
			t.Fatalf("offset %d is not a free line of the control block", o)
		}
	}
	if got := base(c.ReqPayload(CallSlots - 1)); got != v.PayloadArea0+(v.Slots-1)*v.PayloadAreaSize || len(c.ReqPayload(0)) != v.PayloadAreaSize {
		t.Fatalf("last request payload area at %d", got)
	}
	if got := base(c.AnsPayload(1)); got != size/2+v.PayloadArea0+v.PayloadAreaSize || int(c.PayloadOff(true, 1)) != got {
		t.Fatalf("slot 1's answer payload area at %d (PayloadOff %d)", got, c.PayloadOff(true, 1))
	}
	if CheckCalls(2*uint64(CallsReserved)) || !CheckCalls(2*uint64(CallsReserved)+2*65536) {
		t.Fatal("CheckCalls does not require room after the payload areas")
	}
	for _, n := range v.Negotiate {
		cl, sv := unhex(t, n.Client), unhex(t, n.Server)
		f := cl[5] & sv[5]
		if in := f&FeatureShm != 0 && f&FeatureShmCalls != 0; in != n.Calls {
			t.Errorf("%s: call slots in use %v, want %v", n.Name, in, n.Calls)
		}
		if in := f&FeatureShm != 0 && f&FeatureShmCalls != 0 && f&FeatureShmCallsBell != 0; in != n.Bell {
			t.Errorf("%s: the client's bell in use %v, want %v", n.Name, in, n.Bell)
		}
	}
}

// TestCopyFrameBounds: a length word over the area or under the minimum is
// refused (bad_call) before anything is copied.
func TestCopyFrameBounds(t *testing.T) {
	var dst [CallAreaSize]byte
	area := make([]byte, CallAreaSize)
	for _, n := range []uint32{0, 15, CallAreaSize + 1, 1 << 31, ^uint32(0)} {
		if _, err := CopyFrame(&dst, area, n, 16); errName(err) != NameBadCall {
			t.Errorf("length %d: %v, want %s", n, err, NameBadCall)
		}
	}
	area[CallAreaSize-1] = 7
	f, err := CopyFrame(&dst, area, CallAreaSize, 16)
	if err != nil || len(f) != CallAreaSize || f[CallAreaSize-1] != 7 {
		t.Fatalf("a full area: %v", err)
	}
}

// TestVectorCallsAreaDescs: a descriptor in call slot k's frame is an area
// payload only at slot k's area of the sender's half and within its size;
// any other goes to the tracker, whose range starts after the areas.
func TestVectorCallsAreaDescs(t *testing.T) {
	v := loadCallsVectors(t)
	if len(v.AreaDescs) < 8 {
		t.Fatalf("%d area_descs", len(v.AreaDescs))
	}
	size := uint64(v.AreaRegionSize)
	r := &Region{mem: make([]byte, size), size: size}
	c := NewCalls(r)
	for _, e := range v.AreaDescs {
		server := e.Sender == "server"
		lo, hi := uint64(0), size/2
		if server {
			lo, hi = size/2, size
		}
		d, err := ParseDesc(unhex(t, e.Hex))
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		in, err := c.AreaDesc(server, e.K, d)
		if err == nil && !in {
			err = NewTracker(lo+CallsReserved, hi, 16<<20).Accept(d)
		}
		if in != e.Area || (err == nil) != e.OK || (!e.OK && errName(err) != e.Error) {
			t.Errorf("%s: area %v, err %v; want area %v, ok %v (%s)", e.Name, in, err, e.Area, e.OK, e.Error)
		}
	}
}

// FuzzAreaDesc: any descriptor in any slot's frame, from either half, is
// either slot k's area payload (starting at the area, 1..PayloadAreaSize
// bytes: then it lies wholly in that area) or, failing the tracker whose
// range starts after the areas, never a view into any control block or
// area; nothing panics.
func FuzzAreaDesc(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 0, 0, 1, 0}, uint8(0), false)
	f.Add([]byte{0, 0, 2, 0, 1, 0, 1, 0}, uint8(1), false)
	f.Add([]byte{0, 0, 0x81, 0, 0, 0, 1, 0}, uint8(1), true)
	const size = 8 << 20
	c := NewCalls(&Region{mem: make([]byte, size), size: size})
	f.Fuzz(func(t *testing.T, b []byte, kb uint8, server bool) {
		k := int(kb) % CallSlots
		d, err := ParseDesc(b)
		if err != nil {
			return
		}
		lo, hi := uint64(0), uint64(size/2)
		if server {
			lo, hi = size/2, size
		}
		in, err := c.AreaDesc(server, k, d)
		switch {
		case in && err == nil:
			a := uint64(c.PayloadOff(server, k))
			if uint64(d.Off) != a || d.End() > a+PayloadAreaSize || d.Len == 0 {
				t.Fatalf("%+v accepted as slot %d's area [%d, %d)", d, k, a, a+PayloadAreaSize)
			}
		case in:
			if d.Len != 0 && d.Len <= PayloadAreaSize {
				t.Fatalf("%+v refused as slot %d's area: %v", d, k, err)
			}
		default:
			if NewTracker(lo+CallsReserved, hi, 16<<20).Accept(d) == nil && uint64(d.Off) < lo+CallsReserved {
				t.Fatalf("%+v accepted inside the reserved block", d)
			}
		}
	})
}

// TestAreaSlot: AreaSlot finds the slot whose payload area a descriptor
// starts at, in the half asked about only, and nothing for a point inside
// an area, a length of 0, or past the last area.
func TestAreaSlot(t *testing.T) {
	const size = 8 << 20
	c := NewCalls(&Region{mem: make([]byte, size), size: size})
	for _, server := range []bool{false, true} {
		for k := range CallSlots {
			off := c.PayloadOff(server, k)
			if got := c.AreaSlot(server, Desc{Off: off, Len: 1}); got != k {
				t.Fatalf("server %v: slot %d's area start gave %d", server, k, got)
			}
			if got := c.AreaSlot(!server, Desc{Off: off, Len: 1}); got != -1 {
				t.Fatalf("server %v: slot %d's area found in the other half as %d", server, k, got)
			}
			for _, d := range []Desc{{Off: off + 64, Len: 1}, {Off: off, Len: 0}} {
				if got := c.AreaSlot(server, d); got != -1 {
					t.Fatalf("server %v: %+v gave slot %d, want none", server, d, got)
				}
			}
		}
		if got := c.AreaSlot(server, Desc{Off: c.PayloadOff(server, CallSlots-1) + PayloadAreaSize, Len: 1}); got != -1 {
			t.Fatalf("server %v: the offset past the last area gave slot %d", server, got)
		}
	}
}

// TestVectorStreamsLayout: the stream slots' flag and words (spec 10.9)
// agree with shm.json, lie in the free part of each slot's 128-byte line
// (10.8's words at 0, 4 and 8 of the client's line, 0 and 4 of the
// server's), and StreamsInUse agrees with the negotiation vectors.
func TestVectorStreamsLayout(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "protocol", "vectors", "shm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Streams struct {
			FeatureFlag uint8 `json:"feature_flag"`
			OffStrSeq   int   `json:"off_str_seq"`
			OffStrLen   int   `json:"off_str_len"`
			OffReqTaken int   `json:"off_req_taken"`
			OffSWant    int   `json:"off_swant"`
			OffStrTaken int   `json:"off_str_taken"`
			OffCWant    int   `json:"off_cwant"`
			OffCLook    int   `json:"off_clook"`
			OffSLook    int   `json:"off_slook"`
			QueueBytes  int   `json:"queue_bytes"`
			Negotiate   []struct {
				Name, Client, Server string
				Streams              bool
			}
		}
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	s := v.Streams
	if s.FeatureFlag != FeatureShmStreams || s.OffStrSeq != OffStrSeq || s.OffStrLen != OffStrLen || s.OffReqTaken != OffReqTaken ||
		s.OffSWant != OffSWant || s.OffStrTaken != OffStrTaken || s.OffCWant != OffCWant || s.OffCLook != OffCLook || s.OffSLook != OffSLook || s.QueueBytes != 1<<20 {
		t.Fatalf("stream-slot constants differ from shm.json: %+v", s)
	}
	server := map[int]bool{OffSeq: true, OffLen: true}
	for _, o := range []int{OffStrSeq, OffStrLen, OffReqTaken, OffSWant, OffSLook} {
		if server[o] || o%4 != 0 || o+4 > CallLine {
			t.Fatalf("server word at %d overlaps or leaves the line", o)
		}
		server[o] = true
	}
	client := map[int]bool{OffSeq: true, OffLen: true, OffSleeping: true}
	for _, o := range []int{OffStrTaken, OffCWant, OffCLook} {
		if client[o] || o%4 != 0 || o+4 > CallLine {
			t.Fatalf("client word at %d overlaps or leaves the line", o)
		}
		client[o] = true
	}
	if len(s.Negotiate) < 4 {
		t.Fatalf("%d negotiation vectors", len(s.Negotiate))
	}
	for _, n := range s.Negotiate {
		c, _ := hex.DecodeString(n.Client)
		sv, _ := hex.DecodeString(n.Server)
		if got := StreamsInUse(c[5], sv[5]); got != n.Streams {
			t.Errorf("%s: StreamsInUse %v, want %v", n.Name, got, n.Streams)
		}
	}
}

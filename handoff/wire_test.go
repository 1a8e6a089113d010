package handoff

import (
	"bytes"
	"testing"

	"github.com/udskit/udskit/uds"
)

func TestWireRoundTrip(t *testing.T) {
	o := offer{version: 1, pid: 77, state: []byte("st"), listeners: []ListenerInfo{
		{Name: "a", Addr: uds.Addr{Kind: uds.Unix, Name: "/run/a.sock"}},
		{Name: "b", Addr: uds.Addr{Kind: uds.Abstract, Name: "b"}},
		{Name: "c", Addr: uds.Addr{Kind: uds.TCP, Name: "127.0.0.1:80"}},
	}}
	f, err := encodeOffer(o)
	if err != nil {
		t.Fatal(err)
	}
	typ, n, err := parseHeader(f[:headerLen], DefaultMaxState)
	if err != nil || typ != msgOffer || n != len(f)-headerLen {
		t.Fatalf("header %d %d %v", typ, n, err)
	}
	got, err := decodeOffer(f[headerLen:], 3, DefaultMaxState)
	if err != nil || got.pid != 77 || !bytes.Equal(got.state, o.state) || len(got.listeners) != 3 || got.listeners[1] != o.listeners[1] {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := decodeOffer(f[headerLen:], 2, DefaultMaxState); err == nil {
		t.Fatal("descriptor count mismatch accepted")
	}
	if _, err := decodeOffer(f[headerLen:], 3, 1); err == nil {
		t.Fatal("state over the cap accepted")
	}
	h := encodeHello(hello{minV: 1, maxV: 3, who: "me"})
	if hh, err := decodeHello(h[headerLen:]); err != nil || hh.who != "me" || hh.maxV != 3 {
		t.Fatalf("%+v %v", hh, err)
	}
	big := make([]byte, headerLen)
	copy(big, appendHeader(nil, msgHello, 1<<30))
	if _, _, err := parseHeader(big, DefaultMaxState); err == nil {
		t.Fatal("a 1 GiB hello passed the header cap")
	}
}

// FuzzDecode feeds arbitrary bytes to every decoder: no panic, and nothing
// accepted breaks a cap.
func FuzzDecode(f *testing.F) {
	o, _ := encodeOffer(offer{version: 1, listeners: []ListenerInfo{{Name: "x", Addr: uds.Addr{Kind: uds.Unix, Name: "/x"}}}, state: []byte("s")})
	f.Add(o, uint8(1))
	f.Add(encodeHello(hello{minV: 1, maxV: 1, who: "w"}), uint8(0))
	f.Add(encodeText(msgError, 1, "busy"), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8) {
		if len(b) >= headerLen {
			if typ, n, err := parseHeader(b[:headerLen], DefaultMaxState); err == nil {
				if lim, _ := bodyCap(typ, DefaultMaxState); n > lim {
					t.Fatalf("body %d over cap %d", n, lim)
				}
			}
			b = b[headerLen:]
		}
		if h, err := decodeHello(b); err == nil && len(h.who) > maxTextLen {
			t.Fatal("hello name over cap")
		}
		if off, err := decodeOffer(b, int(nfds)%(MaxListeners+2), DefaultMaxState); err == nil {
			if len(off.listeners) > MaxListeners || len(off.state) > DefaultMaxState {
				t.Fatal("offer over caps")
			}
			for _, l := range off.listeners {
				if checkName(l.Name) != nil || l.Addr.Kind == 0 {
					t.Fatalf("bad listener accepted: %+v", l)
				}
			}
		}
		if _, msg, err := decodeText(b); err == nil && len(msg) > maxTextLen {
			t.Fatal("text over cap")
		}
	})
}

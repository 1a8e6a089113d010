package handoff

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// TestHostileOfferer: a process on the control socket that answers the
// hello with malformed offers, descriptors where none belong, or
// descriptors that are not listening sockets. Acquire (and Listener) fail,
// and every descriptor that arrived is closed.
func TestHostileOfferer(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	ctl := filepath.Join(dir, "evil.handoff")
	ln, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pipeFDs := func() []int {
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil { // Pipe2 is not on macOS
			t.Fatal(err)
		}
		unix.CloseOnExec(p[0])
		unix.CloseOnExec(p[1])
		return p[:]
	}
	offerOf := func(n int) []byte {
		o := offer{version: 1}
		for i := range n {
			o.listeners = append(o.listeners, ListenerInfo{Name: string(rune('a' + i)), Addr: uds.Addr{Kind: uds.Unix, Name: "/x.sock"}})
		}
		b, err := encodeOffer(o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name  string
		frame []byte
		fds   bool
	}{
		{"more descriptors than listeners", offerOf(1), true},
		{"descriptors on an error", encodeText(msgError, codeBusy, "busy"), true},
		{"pipes instead of sockets", offerOf(2), true},
		{"body over the cap", appendHeader(nil, msgOffer, 1<<30), false},
		{"truncated offer", offerOf(1)[:headerLen+3], false},
		{"unknown type", appendHeader(nil, 99, 0), false},
	}
	base := testutil.CountFDs(t)
	for _, tc := range cases {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.ReadFull(c, make([]byte, headerLen)) // the hello's header is enough
			if tc.fds {
				p := pipeFDs()
				uds.SendFDs(c.(*net.UnixConn), tc.frame, p)
				unix.Close(p[0])
				unix.Close(p[1])
			} else {
				c.Write(tc.frame)
			}
			if uc, ok := c.(*net.UnixConn); ok {
				uc.CloseWrite()
			}
			io.Copy(io.Discard, c)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a, err := Acquire(ctx, ctl, AcquireOptions{Logger: quiet})
		cancel()
		if err == nil {
			// Well-formed enough to decode: every Listener must refuse.
			for _, li := range a.Listeners() {
				if _, lerr := a.Listener(li.Name, uds.ListenOptions{}); lerr == nil {
					t.Errorf("%s: a pipe was taken as a listener", tc.name)
				}
			}
			a.Abort("hostile")
		}
		<-served
		if err == nil && tc.name != "pipes instead of sockets" {
			t.Errorf("%s: Acquire succeeded", tc.name)
		}
		if now := testutil.CountFDs(t); now != base {
			t.Fatalf("%s: %d fds open, want %d", tc.name, now, base)
		}
	}
}

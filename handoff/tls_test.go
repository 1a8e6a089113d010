package handoff

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

// A tls: listener is not handed off: a successor that asks fails at once
// with ErrTLSListener (before contacting anyone), an acquirer that asks an
// offerer holding one is refused with the reason, and the running process
// keeps serving TLS clients throughout.
func TestTLSListenerIsNotHandedOff(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	ca := testpki.NewCA("ca")
	load := func(name string, l testpki.Leaf) *tlsfiles.Source {
		f := testpki.Write(dir, name, ca.Issue(l), ca.PEM)
		src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	srv := load("server", testpki.Leaf{CommonName: "srv", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cli := load("client", testpki.Leaf{CommonName: "cli"})
	opts := uds.ListenOptions{TLS: srv.ServerConfig(), PeerPolicy: uds.AllowAnyVerified(), Logger: quiet}

	// The successor's side: refused before the control socket is even dialed.
	_, err := Start(context.Background(), []Spec{{Name: "rpc", Address: "tls:127.0.0.1:0", Listen: opts}},
		ProcessOptions{Control: filepath.Join(dir, "nobody-offers.handoff"), Takeover: true, Logger: quiet})
	if !errors.Is(err, ErrTLSListener) || !strings.Contains(err.Error(), "restart it instead") {
		t.Fatalf("takeover of a tls: listener: err = %v, want ErrTLSListener saying what to do", err)
	}

	// The offerer's side.
	l, err := Listen(context.Background(), "rpc", "tls:127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	s := serveTag(l, "old")
	defer s.srv.Close()
	ctl := filepath.Join(dir, "svc.handoff")
	off, err := Offer(context.Background(), []*Listener{l}, OfferOptions{Control: ctl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	askTLS := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", l.UAddr().Name, cli.ClientConfig(tlsfiles.ClientOptions{ServerName: "127.0.0.1"}))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "who\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		return strings.TrimSpace(line)
	}
	if got := askTLS(); got != "old" {
		t.Fatalf("before: %q", got)
	}
	a, err := acquire(t, ctl)
	if err == nil {
		a.Abort("test")
		t.Fatal("an offer holding a tls: listener was made")
	}
	if !strings.Contains(err.Error(), "cannot be handed off") {
		t.Fatalf("acquire: err = %v, want the reason", err)
	}
	if got := askTLS(); got != "old" {
		t.Fatalf("after the refused acquire: %q, want the old process serving", got)
	}
	select {
	case <-off.Committed():
		t.Fatal("committed")
	default:
	}
}

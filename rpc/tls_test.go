package rpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

const (
	tlsWebID = "spiffe://prod.example/ns/app/sa/web"
	tlsDBID  = "spiffe://prod.example/ns/app/sa/db"
)

type whoAmI struct {
	Local    bool   `json:"local"`
	UID      uint32 `json:"uid"`
	SPIFFEID string `json:"spiffe_id"`
}

// tlsServer serves "who" on tls:127.0.0.1:0 with policy; calls counts the
// handler runs.
func tlsServer(t *testing.T, dir string, ca *testpki.CA, policy uds.PeerPolicy) (addr string, calls *atomic.Int64) {
	t.Helper()
	f := testpki.Write(dir, "server", ca.Issue(testpki.Leaf{CommonName: "db", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: tlsDBID}), ca.PEM)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := uds.Listen(context.Background(), "tls:127.0.0.1:0", uds.ListenOptions{TLS: src.ServerConfig(), PeerPolicy: policy, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ServerOptions{Logger: quiet})
	calls = new(atomic.Int64)
	HandleJSON(s, "who", func(ctx context.Context, _ struct{}) (whoAmI, error) {
		calls.Add(1)
		p, _ := PeerFromContext(ctx)
		w := whoAmI{Local: p.HasCred, UID: p.Cred.UID}
		if p.Remote != nil {
			w.SPIFFEID = p.Remote.SPIFFEID
		}
		return w, nil
	})
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return l.UAddr().String(), calls
}

func tlsClient(t *testing.T, dir string, ca *testpki.CA, spiffeID string) *tlsfiles.Source {
	t.Helper()
	f := testpki.Write(dir, "client", ca.Issue(testpki.Leaf{CommonName: "client", SPIFFEID: spiffeID}), ca.PEM)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestTLSHandlerSeesSPIFFEID(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	addr, calls := tlsServer(t, dir, ca, uds.AllowSPIFFE(tlsWebID))
	src := tlsClient(t, dir, ca, tlsWebID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{TLS: src.ClientConfig(tlsfiles.ClientOptions{ServerSPIFFEID: tlsDBID})})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var w whoAmI
	if err := c.Call(ctx, "who", struct{}{}, &w); err != nil {
		t.Fatal(err)
	}
	if w.Local || w.SPIFFEID != tlsWebID || calls.Load() != 1 {
		t.Fatalf("who = %+v after %d calls", w, calls.Load())
	}
	// Many calls over TLS on a few connections.
	for i := range 200 {
		if err := c.Call(ctx, "who", struct{}{}, &w); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// A refused workload never reaches a handler, and its error names why.
func TestTLSRefusedBeforeHandler(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	addr, calls := tlsServer(t, dir, ca, uds.AllowSPIFFE(tlsWebID))
	batch := tlsClient(t, dir, ca, "spiffe://prod.example/ns/app/sa/batch")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, addr, ClientOptions{TLS: batch.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"}), NoReconnect: true})
	if err == nil || !strings.Contains(err.Error(), "peer policy") {
		t.Fatalf("err = %v, want a refusal naming the peer policy", err)
	}
	// A plaintext client on the TLS port is told the server speaks TLS.
	plain := "tcp:" + strings.TrimPrefix(addr, "tls:")
	_, err = Dial(ctx, plain, ClientOptions{NoReconnect: true})
	var he *HandshakeError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "the server speaks TLS") {
		t.Fatalf("plaintext client: %v", err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d handler calls from refused peers", n)
	}
}

// A TLS client on a plaintext udskit server is told so.
func TestTLSClientOnPlaintextServer(t *testing.T) {
	s := echoServer()
	l, err := uds.Listen(context.Background(), "tcp:127.0.0.1:0", uds.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	defer s.Close()
	dir := t.TempDir()
	src := tlsClient(t, dir, testpki.NewCA("ca"), tlsWebID)
	addr := "tls:" + l.UAddr().Name
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Dial(ctx, addr, ClientOptions{TLS: src.ClientConfig(tlsfiles.ClientOptions{}), NoReconnect: true})
	if err == nil || !strings.Contains(err.Error(), "speaks plaintext udskit") {
		t.Fatalf("err = %v", err)
	}
}

package rpc

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

// BenchmarkTLSParallel16 is the rpc-over-TLS path at 16 callers x 1 KiB, client
// and server in this process (mutual TLS 1.3 over loopback TCP): the cell of
// `udskit bench --transports rpc-tls` for profiling with -cpuprofile.
func BenchmarkTLSParallel16(b *testing.B) {
	dir := b.TempDir()
	ca := testpki.NewCA("ca")
	load := func(name string, l testpki.Leaf) *tlsfiles.Source {
		f := testpki.Write(dir, name, ca.Issue(l), ca.PEM)
		src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return src
	}
	srv := load("server", testpki.Leaf{CommonName: "db", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: tlsDBID})
	cli := load("client", testpki.Leaf{CommonName: "web", SPIFFEID: tlsWebID})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := uds.Listen(context.Background(), "tls:127.0.0.1:0", uds.ListenOptions{TLS: srv.ServerConfig(), PeerPolicy: uds.AllowSPIFFE(tlsWebID), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	s := NewServer(ServerOptions{Logger: quiet})
	s.HandleRaw("echo", func(_ context.Context, req, _ []byte) ([]byte, error) { return req, nil })
	go s.Serve(l)
	defer s.Close()
	c, err := Dial(context.Background(), l.UAddr().String(), ClientOptions{TLS: cli.ClientConfig(tlsfiles.ClientOptions{ServerSPIFFEID: tlsDBID}), NoReconnect: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const size = 1 << 10
	b.SetBytes(size)
	b.ReportAllocs()
	b.SetParallelism(8) // 16 callers on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		msg := make([]byte, size)
		var out []byte
		for pb.Next() {
			var err error
			if out, err = c.CallRaw(context.Background(), "echo", msg, out[:0]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"embed"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/udskit/udskit/internal/grpcecho"
)

// The TLS rows: the same three protocols over TCP with mutual TLS 1.3, all
// with the same certificates (tlscerts/: a bench-only CA whose keys are
// public). rpc-tls is udskit's tls: address; grpc-tls is grpc-go with
// credentials.NewTLS; raw-tls is the fixed-size echo through crypto/tls,
// the floor TLS sets.
//
//go:embed tlscerts/*.pem
var tlsCerts embed.FS

var benchTLSOnce = sync.OnceValues(func() (*tls.Config, *tls.Config) {
	read := func(name string) []byte {
		b, err := tlsCerts.ReadFile("tlscerts/" + name)
		if err != nil {
			panic(err)
		}
		return b
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(read("ca.pem"))
	srv, err := tls.X509KeyPair(read("server.pem"), read("server-key.pem"))
	if err != nil {
		panic(err)
	}
	cli, err := tls.X509KeyPair(read("client.pem"), read("client-key.pem"))
	if err != nil {
		panic(err)
	}
	server := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srv}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	client := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cli}, RootCAs: pool, ServerName: "127.0.0.1"}
	return server, client
})

// BenchTLS returns the server and client configurations of the TLS rows.
func BenchTLS() (server, client *tls.Config) { return benchTLSOnce() }

func init() {
	Register(&Transport{
		Name: "rpc-tls", Network: "tcp", Over: "tls", Family: "rpc",
		PerRequest: "as rpc-tcp, over mutual TLS 1.3 (udskit's tls: address, TLS records on each connection)",
		Serve: func(ctx context.Context, ln net.Listener) error {
			s, _ := BenchTLS()
			return rpcEchoServer(ctx, tls.NewListener(ln, s))
		},
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			_, cc := BenchTLS()
			return dialRPC(ctx, "tls:"+address, conc, cc)
		},
	})
	Register(&Transport{
		Name: "grpc-tls", Network: "tcp", Over: "tls", Family: "grpc",
		PerRequest: "as grpc-tcp, over mutual TLS 1.3 with the same certificates (credentials.NewTLS)",
		Serve: func(ctx context.Context, ln net.Listener) error {
			sc, _ := BenchTLS()
			return serveGRPC(ctx, ln, grpc.Creds(credentials.NewTLS(sc)))
		},
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			_, cc := BenchTLS()
			c, err := grpcecho.DialCreds(ctx, network, address, credentials.NewTLS(cc))
			if err != nil {
				return nil, err
			}
			return grpcClient(c, conc), nil
		},
	})
	Register(&Transport{
		Name: "raw-tls", Network: "tcp", Over: "tls", Family: "raw",
		PerRequest: "as raw-tcp (the floor), through crypto/tls with the same certificates: the least a TLS echo costs",
		Serve: func(ctx context.Context, ln net.Listener) error {
			s, _ := BenchTLS()
			return serveRaw(ctx, tls.NewListener(ln, s))
		},
		Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
			_, cc := BenchTLS()
			return dialConns(ctx, network, address, conc, func(c net.Conn) Caller {
				tc := tls.Client(c, cc)
				return &rawCaller{c: tc}
			})
		},
	})
}

package uds

import (
	"context"
	"crypto/tls"
	"testing"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/tlsfiles"
)

// BenchmarkTLSHandshake measures a mutual TLS 1.3 connect (ECDSA P-256,
// the policy checked inside) through uds.Dial, full and resumed with a
// session ticket: go test -run - -bench TLSHandshake -benchtime 300x ./uds
func BenchmarkTLSHandshake(b *testing.B) {
	t := &testing.T{}
	p := newPKI(t)
	l, _, _ := tlsEcho(t, p, AllowSPIFFE(webID))
	defer l.Close()
	cli := p.client(t, "web", testpki.Leaf{SPIFFEID: webID}, nil)
	for _, resume := range []bool{false, true} {
		name := "full"
		conf := cli.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"})
		if resume {
			name = "resumed"
			conf.ClientSessionCache = tls.NewLRUClientSessionCache(8)
		}
		b.Run(name, func(b *testing.B) {
			resumed := 0
			for b.Loop() {
				c, err := Dial(context.Background(), l.UAddr().String(), DialOptions{TLS: conf})
				if err != nil {
					b.Fatal(err)
				}
				// The session ticket arrives after the handshake: a round
				// trip lets the client read it before closing.
				c.Write([]byte("x"))
				var one [1]byte
				c.Read(one[:])
				if c.(*tls.Conn).ConnectionState().DidResume {
					resumed++
				}
				c.Close()
			}
			b.ReportMetric(float64(resumed)/float64(b.N), "resumed/op")
		})
	}
}

package uds

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// BenchmarkConnect measures a full connection set-up and one-byte exchange:
// dial, accept (with SO_PEERCRED and the policy for uds), write, read, close.
// Compare: go test -run '^$' -bench Connect -benchtime 2s ./uds
func BenchmarkConnect(b *testing.B) {
	for _, tc := range []struct {
		name   string
		listen func(path string) (net.Listener, error)
	}{
		{"net.Listen", func(p string) (net.Listener, error) { return net.Listen("unix", p) }},
		{"uds.Listen", func(p string) (net.Listener, error) {
			return Listen(context.Background(), p, ListenOptions{})
		}},
		{"uds.Listen+Policy", func(p string) (net.Listener, error) {
			return Listen(context.Background(), p, ListenOptions{Policy: AllowSameUser()})
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "b.sock")
			l, err := tc.listen(path)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					var buf [1]byte
					io.ReadFull(c, buf[:])
					c.Write(buf[:])
					c.Close()
				}
			}()
			buf := make([]byte, 1)
			for b.Loop() {
				c, err := net.Dial("unix", path)
				if err != nil {
					b.Fatal(err)
				}
				c.Write(buf)
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

package capture

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

// BenchmarkInterposeToFile streams through an interposed socket recording
// to a pcapng file (bytes/s is the relay's throughput).
func BenchmarkInterposeToFile(b *testing.B) {
	dir := testutil.ShortDir(b, 0o755)
	path := filepath.Join(dir, "b.sock")
	l := testutil.ListenUnix(b, path)
	testutil.Serve(b, l, func(c net.Conn) { io.CopyBuffer(io.Discard, c, make([]byte, 256<<10)); c.Close() })
	w, closeOut, err := CreatePcap(filepath.Join(dir, "b.pcapng"), OutputOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer closeOut()
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewPcapSink(w, PcapOptions{}), Logger: quietLog()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ip.Serve(ctx)
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	c, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.UnixConn).CloseWrite()
	io.Copy(io.Discard, c)
	c.Close()
	b.StopTimer()
	os.Remove(filepath.Join(dir, "b.pcapng"))
}

package capture_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/record"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// A udskit server and client that record their own traffic (mode 3).
func Example_rpc() {
	dir, _ := os.MkdirTemp("", "capture-example")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "app.sock")
	ctx := context.Background()

	w, closeFile, err := record.CreatePcap(filepath.Join(dir, "app.pcapng"), record.OutputOptions{})
	if err != nil {
		panic(err)
	}
	sink := record.NewPcapSink(w, record.PcapOptions{})

	s := rpc.NewServer(rpc.ServerOptions{WrapConn: capture.ServerWrap(sink, sock)})
	s.HandleRaw("echo", func(ctx context.Context, req, dst []byte) ([]byte, error) { return append(dst, req...), nil })
	l, _ := uds.Listen(ctx, sock, uds.ListenOptions{})
	go s.Serve(l)

	c, _ := rpc.Dial(ctx, sock, rpc.ClientOptions{WrapConn: capture.ClientWrap(sink, sock+" (client side)")})
	var out []byte
	_ = c.Call(ctx, "echo", []byte("hi"), &out)
	c.Close()
	s.Shutdown(ctx)
	closeFile()
	fmt.Println(string(out), w.Packets() > 0)
	// Output: hi true
}

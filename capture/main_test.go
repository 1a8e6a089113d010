package capture

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.Main(m, map[string]testutil.HelperFunc{
		// interpose PATH: interpose on PATH, say ready, relay until killed
		// or stdin closes.
		"interpose": func(path string) int {
			ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: NewTextSink(io.Discard, TextOptions{}), Logger: quietLog()})
			if err != nil {
				fmt.Println(err)
				return 1
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() { testutil.Ready(); cancel() }()
			if err := ip.Serve(ctx); err != nil {
				return 1
			}
			return 0
		},
		// dial PATH: connect, print the first line the server sends.
		"dial": func(path string) int {
			c, err := net.Dial("unix", path)
			if err != nil {
				fmt.Println("dial:", err)
				return 1
			}
			defer c.Close()
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				fmt.Println("read:", err)
				return 1
			}
			fmt.Print(line)
			return 0
		},
	})
}

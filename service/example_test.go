package service_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/service"
)

// A sidecar of one's own: an rpc.Server run by service.Run with the linger
// drain a pod wants. SIGTERM (here: the context, canceled once a client has
// called) keeps it serving until the client has gone.
func Example() {
	dir, _ := os.MkdirTemp("", "service-example")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "sidecar.sock")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	res, err := service.Run(ctx, service.Options{
		Name:         "sidecar",
		Listen:       []handoff.Spec{{Name: "rpc", Address: sock}}, // owner-only socket; sidecar.sock.handoff offers it to a successor
		Drain:        service.DrainLinger,
		MinGrace:     100 * time.Millisecond,
		DrainTimeout: 10 * time.Second,
		Logger:       slog.New(slog.DiscardHandler),
		Ready: func(context.Context) error {
			// The app: one call, then the pod stops (a SIGTERM would do the same).
			go func() {
				c, err := rpc.Dial(context.Background(), sock, rpc.ClientOptions{})
				if err != nil {
					log.Fatal(err)
				}
				stop()
				var out map[string]string
				if err := c.Call(context.Background(), "hello", map[string]string{"name": "pod"}, &out); err != nil {
					log.Fatal(err)
				}
				fmt.Println(out["greeting"])
				c.Close() // the app's last connection: the sidecar exits now
			}()
			return nil
		},
	}, func(ctx context.Context, ls []*handoff.Listener) (service.Service, error) {
		s := rpc.NewServer(rpc.ServerOptions{})
		rpc.HandleJSON(s, "hello", func(ctx context.Context, req map[string]string) (map[string]string, error) {
			return map[string]string{"greeting": "hello " + req["name"]}, nil
		})
		return s.On(ls[0]), nil
	})
	fmt.Println(res.Outcome, err)
	// Output:
	// hello pod
	// drained <nil>
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/udskit/udskit/handoff"
	"github.com/udskit/udskit/uds"
)

// handoffFlags are the zero-downtime takeover flags shared by serve and proxy.
type handoffFlags struct {
	takeover bool
	socket   string
	detach   bool
}

func (h *handoffFlags) add(f *pflag.FlagSet) {
	f.BoolVar(&h.takeover, "handoff", false, "take the listening sockets over from the instance running now (no connection refused), then let it drain and exit")
	f.StringVar(&h.socket, "handoff-socket", "", "control socket for handoffs; setting it lets a later --handoff take over from this instance (default with --handoff: the first unix listen path + .handoff)")
	f.BoolVar(&h.detach, "detach", false, "with --handoff: run the new instance in the background and exit once it has taken over (for systemd ExecReload=)")
}

// control returns the control socket path: --handoff-socket, else derived
// from the first unix path address when taking over, else "" (no handoffs).
func (h *handoffFlags) control(addrs ...string) (string, error) {
	if h.detach && !h.takeover {
		return "", errors.New("--detach goes with --handoff")
	}
	if h.socket != "" || !h.takeover {
		return h.socket, nil
	}
	for _, s := range addrs {
		if a, err := uds.ParseAddr(s); err == nil && a.Kind == uds.Unix {
			return handoff.ControlPath(a.Name), nil
		}
	}
	return "", errors.New("--handoff: give --handoff-socket (the running instance's control socket); it cannot be derived from a non-path address")
}

// runDetached re-runs this command without --detach as a background
// successor and returns once it has taken over.
func (h *handoffFlags) runDetached(ctx context.Context) error {
	var args []string
	for _, a := range os.Args[1:] {
		if a != "--detach" && a != "--detach=true" {
			args = append(args, a)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := handoff.RunDetached(ctx, args); err != nil {
		return fmt.Errorf("takeover failed; the running instance serves on: %w", err)
	}
	return nil
}

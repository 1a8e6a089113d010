package main

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/pflag"

	"github.com/udskit/udskit/service"
)

// handoffFlags are the zero-downtime takeover flags shared by serve and
// proxy; package service does the handoff.
type handoffFlags struct {
	takeover bool
	socket   string
	detach   bool
}

func (h *handoffFlags) add(f *pflag.FlagSet) {
	f.BoolVar(&h.takeover, "handoff", false, "take the listening sockets over from the instance running now (no connection refused), then let it drain and exit")
	f.StringVar(&h.socket, "handoff-socket", "", "control socket on which a later --handoff takes over from this instance (default: the first unix listen path + .handoff; none: do not offer)")
	f.BoolVar(&h.detach, "detach", false, "with --handoff: run the new instance in the background and exit once it has taken over (for systemd ExecReload=)")
}

// apply sets the handoff options of o and checks them (bad usage). With
// --detach it runs the successor in the background and says the command is
// done.
func (h *handoffFlags) apply(ctx context.Context, o *service.Options) (done bool, err error) {
	if h.detach && !h.takeover {
		return true, usage(errors.New("--detach goes with --handoff"))
	}
	o.Takeover, o.Control = h.takeover, h.socket
	if _, err := o.ControlPath(); err != nil {
		return true, usage(err)
	}
	if h.detach {
		var args []string
		for _, a := range os.Args[1:] {
			if a != "--detach" && a != "--detach=true" {
				args = append(args, a)
			}
		}
		return true, service.Detach(ctx, args)
	}
	return false, nil
}

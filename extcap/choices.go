package extcap

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/udskit/udskit/socklist"
)

// MaxChoices bounds the sockets offered (a host can have thousands); the
// rest can still be typed.
const MaxChoices = 200

// Choices lists the listening stream sockets of this host that have a
// filesystem path, as `udskit ls --listening` sees them: the sockets a
// capture can select. Sorted by path, at most MaxChoices.
func Choices(ctx context.Context) ([]Choice, error) {
	snap, err := socklist.List(ctx, socklist.Options{})
	if err != nil {
		return nil, fmt.Errorf("extcap: listing sockets: %w", err)
	}
	return choicesFrom(snap.Select(socklist.Filter{Listening: true})), nil
}

func choicesFrom(socks []socklist.Socket) []Choice {
	seen := map[string]bool{}
	var out []Choice
	for _, s := range socks {
		if !strings.HasPrefix(s.Path, "/") || s.Type != "stream" || seen[s.Path] {
			continue
		}
		seen[s.Path] = true
		d := s.Path
		var who []string
		for _, p := range s.Procs {
			who = append(who, fmt.Sprintf("%s %d", p.Command, p.PID))
		}
		if len(who) > 0 {
			d += " (" + strings.Join(who, ", ")
			if s.Listen != nil {
				d += fmt.Sprintf("; %d clients", s.Listen.Clients)
			}
			d += ")"
		}
		out = append(out, Choice{Value: s.Path, Display: d})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Value < out[j].Value })
	if len(out) > MaxChoices {
		out = out[:MaxChoices]
	}
	return out
}

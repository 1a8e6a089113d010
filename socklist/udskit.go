package socklist

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// Udskit is what a listening udskit rpc server said when asked for its
// statistics (ProbeUdskit): Stats, or Error when it could not tell them.
type Udskit struct {
	// Stats is its answer to the standard method udskit.stats (connections,
	// shared-memory fill level and waits). Its Conns counts the probe's
	// own connection too.
	Stats *rpc.ServerStats `json:"stats,omitempty"`
	// Error says why there are no Stats: a server without udskit.stats (an
	// older one, a Node or Python server), or one that refused the probe.
	Error string `json:"error,omitempty"`
}

// ProbeOptions configures ProbeUdskit. The zero value is what `udskit ls
// --stats` uses.
type ProbeOptions struct {
	// Timeout bounds each socket's probe (connect, hellos, one call).
	// Default 1s.
	Timeout time.Duration
	// Parallel is how many sockets are probed at once. Default 8.
	Parallel int
}

// ProbeUdskit asks every listening stream socket of socks with a name for
// its udskit statistics and sets Udskit on those that are udskit servers.
// Each gets one connection that sends a udskit hello (16 bytes) and, from
// a udskit server, one udskit.stats call, offering no shared memory; other
// servers see a connection that sends the hello and closes (use a PATH-GLOB
// or a pid filter to keep them out). Sockets held by pid 1 (systemd socket
// activation: a connection would start the service) are not probed; the
// returned notes say so. ctx bounds the whole probe.
func ProbeUdskit(ctx context.Context, socks []Socket, opts ProbeOptions) (notes []string) {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 8
	}
	var skipped []string
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i := range socks {
		s := &socks[i]
		if !s.Listening() || s.Type != "stream" || s.Path == "" {
			continue
		}
		if heldByInit(s) {
			skipped = append(skipped, s.Path)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.Udskit = probeOne(ctx, s.Path, opts.Timeout)
		}()
	}
	wg.Wait()
	if len(skipped) > 0 {
		notes = append(notes, fmt.Sprintf("not probed (held by pid 1, systemd socket activation: a connection would start the service): %s; "+
			"ask one with: udskit doctor --probe udskit PATH", strings.Join(skipped, ", ")))
	}
	return notes
}

func heldByInit(s *Socket) bool {
	for _, p := range s.Procs {
		if p.PID == 1 {
			return true
		}
	}
	return false
}

// probeOne returns nil when path is not (or not visibly) a udskit server.
func probeOne(ctx context.Context, path string, timeout time.Duration) *Udskit {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := "unix:" + path
	if strings.HasPrefix(path, "@") {
		addr = path
	}
	conn, err := uds.Dial(ctx, addr, uds.DialOptions{})
	if err != nil {
		return nil
	}
	c, err := rpc.NewClient(ctx, conn, rpc.ClientOptions{NoShm: true})
	if err != nil {
		var he *rpc.HandshakeError
		var re *rpc.Error
		switch {
		case errors.As(err, &he):
			return nil // no udskit hello: another protocol (or it closed at once)
		case errors.As(err, &re):
			return &Udskit{Error: "refused the probe: " + re.Error()}
		}
		return nil
	}
	defer c.Close()
	st, err := rpc.FetchStats(ctx, c)
	switch {
	case err == nil:
		return &Udskit{Stats: &st}
	case rpc.CodeOf(err) == rpc.Unimplemented:
		return &Udskit{Error: "no statistics: the server has no " + rpc.StatsMethod + " (an older udskit, or a Node or Python server)"}
	}
	return &Udskit{Error: err.Error()}
}

// UdskitSummary is the DETAIL text `udskit ls --stats` adds for a udskit
// server: its shared-memory regions, fill level and waits.
func UdskitSummary(u *Udskit) string {
	if u == nil {
		return ""
	}
	if u.Stats == nil {
		return "udskit (" + u.Error + ")"
	}
	sh := u.Stats.Shm
	switch {
	case !sh.Enabled:
		return "udskit, shm off"
	case sh.Conns == 0:
		return fmt.Sprintf("udskit, shm on (no regions), %s", plural(int(sh.Waits), "wait"))
	}
	return fmt.Sprintf("udskit, shm %s %s full (%s of %s), %s", plural(sh.Conns, "region"),
		percent(sh.Fill()), Bytes(sh.InUse), Bytes(sh.Capacity), plural(int(sh.Waits), "wait"))
}

// percent renders a fill level: whole percents, "<1%" for a little.
func percent(f float64) string {
	switch {
	case f <= 0:
		return "0%"
	case f < 0.01:
		return "<1%"
	}
	return strconv.Itoa(int(f*100+0.5)) + "%"
}

// Bytes renders n in B, KiB, MiB or GiB with at most one decimal.
func Bytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 || f >= 100 || f == float64(int(f)) {
		return fmt.Sprintf("%d %s", int(f+0.5), units[i])
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

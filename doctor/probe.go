package doctor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

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
// its udskit statistics (the standard method udskit.stats) and sets Udskit
// on those that are udskit servers. Each gets one connection that sends a
// udskit hello (16 bytes) and, from a udskit server, one call, offering no
// shared memory; other servers see a connection that sends the hello and
// closes (use a PATH-GLOB or a pid filter to keep them out). Sockets held
// by pid 1 (systemd socket activation: a connection would start the
// service) are not probed; the returned notes say so. ctx bounds the whole
// probe.
func ProbeUdskit(ctx context.Context, socks []socklist.Socket, opts ProbeOptions) (notes []string) {
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

func heldByInit(s *socklist.Socket) bool {
	for _, p := range s.Procs {
		if p.PID == 1 {
			return true
		}
	}
	return false
}

// probeOne returns nil when path is not (or not visibly) a udskit server.
func probeOne(ctx context.Context, path string, timeout time.Duration) *socklist.Udskit {
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
			return &socklist.Udskit{Error: "refused the probe: " + re.Error()}
		}
		return nil
	}
	defer c.Close()
	st, err := rpc.FetchStats(ctx, c)
	switch {
	case err == nil:
		return &socklist.Udskit{Stats: udskitStats(st)}
	case rpc.CodeOf(err) == rpc.Unimplemented:
		return &socklist.Udskit{Error: "no statistics: the server has no " + rpc.StatsMethod + " (an older udskit)"}
	}
	return &socklist.Udskit{Error: err.Error()}
}

// udskitStats is st as socklist holds it.
func udskitStats(st rpc.ServerStats) *socklist.UdskitStats {
	sh := st.Shm
	return &socklist.UdskitStats{Conns: st.Conns, Shm: socklist.UdskitShm{
		Enabled: sh.Enabled, Threshold: sh.Threshold, Conns: sh.Conns, InUse: sh.InUse, Capacity: sh.Capacity,
		Sent: sh.Sent, Received: sh.Received, Waits: sh.Waits, OverHalf: sh.OverHalf, Stalled: sh.Stalled,
		SlotCalls: sh.SlotCalls, AreaSentBytes: sh.AreaSentBytes, AreaReceivedBytes: sh.AreaReceivedBytes, SpuriousWakes: sh.SpuriousWakes,
	}}
}

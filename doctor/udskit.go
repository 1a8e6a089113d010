package doctor

import (
	"context"
	"fmt"
	"strconv"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// FullShm is the fill level of the server's shared-memory halves from
// which the shm check warns: responses are about to wait for space.
const FullShm = 0.8

// checkUdskitStats runs after a sniff recognised a udskit server: it asks
// the server for udskit.stats on a connection of its own (offering no
// shared memory, so it counts in conns only) and explains the shared-memory
// path (the "shm" check). Report.Stats keeps the answer.
func checkUdskitStats(ctx context.Context, r *Report, a uds.Addr, opts Options) {
	if a.Kind == uds.TLS && opts.TLS == nil {
		r.add("shm", Skip, "pass --tls-ca (and a client certificate if the server asks) to read its statistics",
			"no TLS client configuration: the server's statistics were not read")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	c, err := rpc.Dial(ctx, a.String(), rpc.ClientOptions{NoShm: true, NoReconnect: true, Conns: 1, TLS: opts.TLS, SSH: opts.SSH})
	if err != nil {
		r.add("shm", Warn, "", "a udskit connection for its statistics failed: %v", err)
		return
	}
	defer c.Close()
	st, err := rpc.FetchStats(ctx, c)
	if err != nil {
		if rpc.CodeOf(err) == rpc.Unimplemented {
			r.add("shm", Skip, "", "the server has no %s (an older udskit): no shared-memory statistics", rpc.StatsMethod)
			return
		}
		r.add("shm", Warn, "", "%s failed: %v", rpc.StatsMethod, err)
		return
	}
	r.Stats = &st
	shmCheck(r, a, st)
}

// shmCheck turns a server's statistics into the shm line: a pure function
// of them (and the address kind), so each verdict is tested on its own.
// It leaves out st.Conns: the doctor's own connections may still be in it.
func shmCheck(r *Report, a uds.Addr, st rpc.ServerStats) {
	sh := st.Shm
	if !sh.Enabled {
		r.add("shm", Pass, "",
			"shared memory is off on this server (a Node or Python server, udskit serve --no-shm, ServerOptions.NoShm, or not Linux): every payload goes through the socket")
		return
	}
	counts := fmt.Sprintf("%s sent and %s received through shared memory since the server started", plural(sh.Sent, "payload"), thousands(sh.Received))
	if sh.SlotCalls > 0 {
		counts += fmt.Sprintf(" (%s through call slots, with %s sent and %s received in their payload areas)",
			plural(sh.SlotCalls, "call"), socklist.Bytes(sh.AreaSentBytes), socklist.Bytes(sh.AreaReceivedBytes))
	}
	if sh.SpuriousWakes > 0 {
		counts += fmt.Sprintf("; %s of the call-slot pollers found nothing to do (a few are races; a client that floods FUTEX_WAKE has its connection ended past 5,000 beyond 500 a second)",
			plural(sh.SpuriousWakes, "wake-up"))
	}
	if sh.Conns == 0 {
		detail := fmt.Sprintf("shared memory: on, no connection uses it now; %s, %s", counts, plural(sh.Waits, "wait"))
		if !a.IsUnix() {
			detail += "; it is negotiated on local unix sockets only, not on this " + kindWords(a.Kind) + " address"
		}
		shmVerdict(r, sh, detail)
		return
	}
	detail := fmt.Sprintf("shared memory: %s, %s full (%s of %s in use), %s; %s",
		conns(sh.Conns), socklist.Percent(sh.Fill()), socklist.Bytes(sh.InUse), socklist.Bytes(sh.Capacity),
		plural(sh.Waits, "wait"), counts)
	shmVerdict(r, sh, detail)
}

// shmVerdict adds the shm line: WARN when answers stalled behind the
// memory budget, payloads waited for space, the halves are nearly full, or
// payloads were too large for a half.
func shmVerdict(r *Report, sh rpc.ShmServerStats, detail string) {
	switch {
	case sh.Stalled > 0:
		r.add("shm", Warn,
			"a client keeps more large payloads in flight on one connection than the server's memory budget per connection and its region hold: "+
				"raise the server's ServerOptions.MaxConnBytes (default 16 MiB) above what one connection has in flight (and MaxServerBytes, default 64 MiB, above what all have), spread large calls over more connections "+
				"(ClientOptions.ShmConns, and LargeConns past 8 MiB in flight), and release RawViews (CallRawView) as soon as they are read; watch udskit_rpc_server_shm_stalled_total (rpcprom)",
			"%s; %s went on the socket instead: the server's half was full while the connection's reader waited for its memory budget (MaxConnBytes, or MaxServerBytes for the whole server), so the releases that would make room were queued unread (slower answers, not lost ones)",
			detail, plural(sh.Stalled, "answer"))
	case sh.Waits > 0:
		r.add("shm", Warn,
			"clients release the server's slots slower than it fills them: a client holding responses unread (a slow consumer), or more large payloads in flight "+
				"on a connection than its region holds; spread large calls over more connections (ClientOptions.ShmConns, and LargeConns past 8 MiB in flight), or raise the server's "+
				"ShmThreshold so mid-sized payloads take the socket; watch udskit_rpc_server_shm_waits_total (rpcprom)",
			"%s: %s waited for space in a full half (back-pressure: each waited within its deadline, slowing its call)", detail, plural(sh.Waits, "payload"))
	case sh.Capacity > 0 && sh.Fill() >= FullShm:
		r.add("shm", Warn,
			"responses will soon wait for space: look for a client that reads its responses slowly, or spread large calls over more connections (ClientOptions.ShmConns, and LargeConns past 8 MiB in flight)",
			"%s: the server's halves are nearly full", detail)
	case sh.OverHalf > 0:
		r.add("shm", Warn, "send payloads of at most half a region (32 MiB with the default 64 MiB region) to keep them off the socket",
			"%s; %s larger than a half went through the socket", detail, plural(sh.OverHalf, "payload"))
	default:
		r.add("shm", Pass, "", "%s", detail)
	}
}

func conns(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}

func plural(n uint64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return thousands(n) + " " + noun + "s"
}

// thousands renders n with a comma every three digits: 1,234,567.
func thousands(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

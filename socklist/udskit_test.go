package socklist

import "testing"

// TestUdskitSummary: the words of each state.
func TestUdskitSummary(t *testing.T) {
	on := func(sh UdskitShm) *Udskit {
		sh.Enabled = true
		return &Udskit{Stats: &UdskitStats{Conns: 1, Shm: sh}}
	}
	for _, c := range []struct {
		u    *Udskit
		want string
	}{
		{nil, ""},
		{&Udskit{Error: "no statistics: x"}, "udskit (no statistics: x)"},
		{&Udskit{Stats: &UdskitStats{}}, "udskit, shm off"},
		{on(UdskitShm{Waits: 1}), "udskit, shm on (no regions), 1 wait"},
		{on(UdskitShm{Conns: 2, InUse: 8 << 20, Capacity: 64 << 20, Waits: 3}), "udskit, shm 2 regions 13% full (8 MiB of 64 MiB), 3 waits"},
		{on(UdskitShm{Conns: 1, InUse: 300 << 10, Capacity: 32 << 20}), "udskit, shm 1 region <1% full (300 KiB of 32 MiB), 0 waits"},
		{on(UdskitShm{Conns: 1, InUse: 1536 << 10, Capacity: 32 << 20}), "udskit, shm 1 region 5% full (1.5 MiB of 32 MiB), 0 waits"},
		{on(UdskitShm{Conns: 1, InUse: 512 << 10, Capacity: 512 << 10, Waits: 4, Stalled: 2}), "udskit, shm 1 region 100% full (512 KiB of 512 KiB), 4 waits, 2 stalled"},
		{on(UdskitShm{Waits: 4, Stalled: 1}), "udskit, shm on (no regions), 4 waits, 1 stalled"},
		{on(UdskitShm{Conns: 1, InUse: 0, Capacity: 32 << 20, SlotCalls: 1200, AreaSentBytes: 3 << 20, AreaReceivedBytes: 3 << 20}), "udskit, shm 1 region 0% full (0 B of 32 MiB), 0 waits, 1200 slot calls (6 MiB in payload areas)"},
		{on(UdskitShm{Conns: 1, Capacity: 32 << 20, SlotCalls: 1, SpuriousWakes: 3}), "udskit, shm 1 region 0% full (0 B of 32 MiB), 0 waits, 1 slot call (0 B in payload areas), 3 spurious wakes"},
	} {
		if got := UdskitSummary(c.u); got != c.want {
			t.Errorf("UdskitSummary(%+v) = %q, want %q", c.u, got, c.want)
		}
	}
}

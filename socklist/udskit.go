package socklist

import (
	"fmt"
	"strconv"
)

// Udskit is what a listening udskit rpc server said when asked for its
// statistics (doctor.ProbeUdskit fills it; `udskit ls --stats`): Stats, or
// Error when it could not tell them.
type Udskit struct {
	// Stats is its answer to the standard method udskit.stats (connections,
	// shared-memory fill level and waits). Its Conns counts the probe's
	// own connection too.
	Stats *UdskitStats `json:"stats,omitempty"`
	// Error says why there are no Stats: a server without udskit.stats (an
	// older one), or one that refused the probe.
	Error string `json:"error,omitempty"`
}

// UdskitStats is the answer of udskit.stats (protocol/spec.md 9.3) as this
// package holds it, field for field the JSON of rpc.ServerStats (socklist
// stays below rpc: kcapture and extcap use it).
type UdskitStats struct {
	Conns int       `json:"conns"`
	Shm   UdskitShm `json:"shm"`
}

// UdskitShm is the server side of the shared-memory path: see
// rpc.ShmServerStats for each field.
type UdskitShm struct {
	Enabled   bool   `json:"enabled"`
	Threshold int    `json:"threshold"`
	Conns     int    `json:"conns"`
	InUse     uint64 `json:"in_use"`
	Capacity  uint64 `json:"capacity"`
	Sent      uint64 `json:"sent"`
	Received  uint64 `json:"received"`
	Waits     uint64 `json:"waits"`
	OverHalf  uint64 `json:"over_half"`
	Stalled   uint64 `json:"stalled"`
	// Call slots (protocol/spec.md 10.8).
	SlotCalls         uint64 `json:"slot_calls"`
	AreaSentBytes     uint64 `json:"area_sent_bytes"`
	AreaReceivedBytes uint64 `json:"area_received_bytes"`
	SpuriousWakes     uint64 `json:"spurious_wakes"`
}

// Fill is InUse/Capacity, 0 without a region.
func (s UdskitShm) Fill() float64 {
	if s.Capacity == 0 {
		return 0
	}
	return float64(s.InUse) / float64(s.Capacity)
}

// UdskitSummary is the DETAIL text `udskit ls --stats` adds for a udskit
// server: its shared-memory regions, fill level and waits (and, when not
// 0, stalled answers, calls through call slots with their payload-area
// bytes, and spurious wake-ups).
func UdskitSummary(u *Udskit) string {
	if u == nil {
		return ""
	}
	if u.Stats == nil {
		return "udskit (" + u.Error + ")"
	}
	sh := u.Stats.Shm
	stalled := ""
	if sh.Stalled > 0 {
		stalled = fmt.Sprintf(", %d stalled", sh.Stalled)
	}
	if sh.SlotCalls > 0 {
		stalled += fmt.Sprintf(", %s (%s in payload areas)", plural(int(sh.SlotCalls), "slot call"), Bytes(sh.AreaSentBytes+sh.AreaReceivedBytes))
	}
	if sh.SpuriousWakes > 0 {
		stalled += ", " + plural(int(sh.SpuriousWakes), "spurious wake")
	}
	switch {
	case !sh.Enabled:
		return "udskit, shm off"
	case sh.Conns == 0:
		return fmt.Sprintf("udskit, shm on (no regions), %s%s", plural(int(sh.Waits), "wait"), stalled)
	}
	return fmt.Sprintf("udskit, shm %s %s full (%s of %s), %s%s", plural(sh.Conns, "region"),
		Percent(sh.Fill()), Bytes(sh.InUse), Bytes(sh.Capacity), plural(int(sh.Waits), "wait"), stalled)
}

// Percent renders a fill level: whole percents, "<1%" for a little.
func Percent(f float64) string {
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

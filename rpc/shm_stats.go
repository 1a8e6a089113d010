package rpc

import (
	"context"

	"github.com/udskit/udskit/internal/shm"
)

// StatsMethod is the standard method that reports a server's connections
// and its shared-memory fill level (protocol/spec.md 9.3): request {} (or
// empty, ignored), response a ServerStats in JSON. `udskit ls --stats`,
// `udskit doctor` and rpcprom's WatchServer read the same numbers.
const StatsMethod = StdPrefix + "stats"

// ServerStats is what StatsMethod answers: a running server's state as an
// operator needs it without code.
type ServerStats struct {
	// Conns counts the connections the server is serving.
	Conns int `json:"conns"`
	// Shm is the shared-memory data path (protocol/spec.md, section 10).
	Shm ShmServerStats `json:"shm"`
}

// ShmServerStats is the server side of the shared-memory data path.
//
// Conns, InUse and Capacity are now (the open connections); Sent, Received,
// Waits, OverHalf and Stalled count since the server started, closed connections
// included, so they only grow (Prometheus counters). Each connection has
// its own region; the server writes responses and stream items into its
// half of it, the client its requests into the other half. InUse and
// Capacity are the server's halves, summed: a client sees its own half's
// fill level with Client.ShmStats.
type ShmServerStats struct {
	// Enabled: the server accepts shared-memory offers (Linux, not NoShm).
	Enabled bool `json:"enabled"`
	// Threshold is the payload size from which the server puts a response
	// in the region (ServerOptions.ShmThreshold or its default).
	Threshold int `json:"threshold"`
	// Conns counts the open connections using shared memory (one region each).
	Conns int `json:"conns"`
	// InUse is the bytes of the server's halves held by responses the
	// clients have not yet released; Capacity the halves' total size.
	// InUse/Capacity is the fill level.
	InUse    uint64 `json:"in_use"`
	Capacity uint64 `json:"capacity"`
	// Sent counts payloads the server put in a region; Received the
	// requests it took from one.
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
	// Waits counts payloads that waited for space in a full half
	// (back-pressure: a client slow to release, or a half too small for
	// the load). Not 0 means calls were slowed down.
	Waits uint64 `json:"waits"`
	// OverHalf counts payloads larger than a half, which went on the socket.
	OverHalf uint64 `json:"over_half"`
	// Stalled counts answers that found the half full while the
	// connection's reader waited for its memory budget (MaxConnBytes or
	// MaxServerBytes), and so went on the socket: the releases that would
	// have made room were queued behind, unread (ShmStats.Stalled). Not 0
	// means a client kept more large payloads in flight on a connection
	// than its budget and region hold. An older server leaves it out (0).
	Stalled uint64 `json:"stalled"`
	// SlotCalls counts unary calls answered through call slots
	// (ClientOptions.ShmCalls, protocol/spec.md 10.8); AreaSentBytes and
	// AreaReceivedBytes the bytes of their payloads carried in the slots'
	// payload areas (answers, requests), which also count in Sent and
	// Received. An older server leaves them out (0).
	SlotCalls         uint64 `json:"slot_calls"`
	AreaSentBytes     uint64 `json:"area_sent_bytes"`
	AreaReceivedBytes uint64 `json:"area_received_bytes"`
	// SpuriousWakes counts wake-ups of the server's call-slot pollers that
	// found nothing changed: a few are races; a client flooding FUTEX_WAKE
	// on its region has its connection ended (protocol_violation) past
	// 5,000 beyond 500 a second.
	SpuriousWakes uint64 `json:"spurious_wakes"`
}

// Fill is InUse/Capacity, 0 without a region.
func (s ShmServerStats) Fill() float64 {
	if s.Capacity == 0 {
		return 0
	}
	return float64(s.InUse) / float64(s.Capacity)
}

// shmClosed holds the counters of a server's closed connections (Server.mu).
type shmClosed struct {
	sent, recv, waits, overHalf, stalled    uint64
	slotCalls, areaSent, areaRecv, spurious uint64
}

// addClosed adds a closing connection's counters to the server's totals.
// The caller holds s.mu and removes the connection from s.conns in the
// same critical section, so Stats counts each payload exactly once.
func (s *Server) addClosedLocked(cs *connShm) {
	if cs == nil {
		return
	}
	var one ShmStats
	one.add(cs)
	t := &s.shmDone
	t.sent += one.Sent
	t.recv += one.Received
	t.waits += one.Waits
	t.overHalf += one.OverHalf
	t.stalled += one.Stalled
	t.slotCalls += one.SlotCalls
	t.areaSent += one.AreaSentBytes
	t.areaRecv += one.AreaReceivedBytes
	t.spurious += one.SpuriousWakes
}

// shmSession returns c's shared-memory session (nil without one).
func (c *serverConn) shmSession() *connShm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shm
}

// Stats returns what StatsMethod answers: open connections, and the
// shared-memory fill level and counters since the server started.
func (s *Server) Stats() ServerStats {
	threshold := s.opts.ShmThreshold
	if threshold <= 0 {
		threshold = shm.DefaultThreshold
	}
	st := ServerStats{Shm: ShmServerStats{Enabled: shm.Supported && !s.opts.NoShm, Threshold: threshold}}
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	done := s.shmDone
	s.mu.Unlock()
	st.Conns = len(conns)
	var live ShmStats
	for _, c := range conns {
		live.add(c.shmSession())
	}
	st.Shm.Conns = live.Conns
	st.Shm.InUse, st.Shm.Capacity = live.InUse, live.Capacity
	st.Shm.Sent = done.sent + live.Sent
	st.Shm.Received = done.recv + live.Received
	st.Shm.Waits = done.waits + live.Waits
	st.Shm.OverHalf = done.overHalf + live.OverHalf
	st.Shm.Stalled = done.stalled + live.Stalled
	st.Shm.SlotCalls = done.slotCalls + live.SlotCalls
	st.Shm.AreaSentBytes = done.areaSent + live.AreaSentBytes
	st.Shm.AreaReceivedBytes = done.areaRecv + live.AreaReceivedBytes
	st.Shm.SpuriousWakes = done.spurious + live.SpuriousWakes
	return st
}

// statsHandler answers StatsMethod; the request is ignored.
func (s *Server) statsHandler(_ context.Context, _, dst []byte) ([]byte, error) {
	return JSON.Marshal(dst, s.Stats())
}

// FetchStats calls StatsMethod on c. A server without it (an older one)
// fails with Unimplemented; a Node or Python server answers without Shm.
func FetchStats(ctx context.Context, c *Client) (ServerStats, error) {
	var st ServerStats
	err := c.Call(ctx, StatsMethod, struct{}{}, &st)
	return st, err
}

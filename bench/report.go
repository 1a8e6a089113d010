package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/udskit/udskit/internal/stats"
)

// Report is the result of Run, and the --json output.
type Report struct {
	System   System    `json:"system"`
	Settings Settings  `json:"settings"`
	Started  time.Time `json:"started"`
	Cells    []Cell    `json:"cells"`
	// Notes are warnings for the reader (noisy cells, truncated samples).
	Notes []string `json:"notes,omitempty"`
}

// Settings echo the effective configuration.
type Settings struct {
	Transports  []string `json:"transports"`
	Sizes       []int    `json:"sizes"`
	Conc        []int    `json:"conc"`
	DurationSec float64  `json:"duration_s"`
	WarmupSec   float64  `json:"warmup_s"`
	Repeat      int      `json:"repeat"`
	Requests    int64    `json:"requests,omitempty"`
	Rate        float64  `json:"rate,omitempty"`
	NoisySpread float64  `json:"noisy_spread"`
	// NoisyRetries and NoisyRetrySec echo Config.NoisyRetries and NoisyRetryTime.
	NoisyRetries  int     `json:"noisy_retries,omitempty"`
	NoisyRetrySec float64 `json:"noisy_retry_s,omitempty"`
}

// Cell is one (transport, size, concurrency) result over all repeats.
type Cell struct {
	Transport string `json:"transport"`
	Family    string `json:"family"`
	Network   string `json:"network"`
	Size      int    `json:"size"`
	Conc      int    `json:"conc"`
	// Requests is the number of requests in each sample (identical for every
	// transport of the same size and concurrency).
	Requests int64 `json:"requests"`
	Repeats  int   `json:"repeats"`
	// ExtraRounds is how many rounds more than Repeat its group measured
	// because a cell was noisy (Config.NoisyRetries); the cell reports the
	// last Repeat rounds.
	ExtraRounds int `json:"extra_rounds,omitempty"`
	// RPS is the median requests/s over the repeats; Spread is (max-min)/median.
	// RPSRounds holds each repeat's req/s in round order: the transports of a
	// (size, concurrency) group are measured one after another within each
	// round, so round r of two cells ran minutes apart at most seconds apart.
	RPS       float64   `json:"rps"`
	RPSRounds []float64 `json:"rps_rounds"`
	RPSMin    float64   `json:"rps_min"`
	RPSMax    float64   `json:"rps_max"`
	Spread    float64   `json:"spread"`
	Noisy     bool      `json:"noisy"`
	// Latency percentiles in microseconds, from one HDR histogram holding every
	// measured request of every repeat.
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	// P50Rounds is each round's own p50 in microseconds, in round order.
	P50Rounds []float64 `json:"p50_rounds_us"`
	MaxUS     float64   `json:"max_us"`
	// Heap allocations per request (median over repeats), client and server process.
	ClientAllocsPerReq float64 `json:"client_allocs_per_req"`
	ServerAllocsPerReq float64 `json:"server_allocs_per_req"`
	// CPU seconds (user+system) spent in one sample, median, and both sides per request.
	ClientCPUSec float64 `json:"client_cpu_s"`
	ServerCPUSec float64 `json:"server_cpu_s"`
	CPUusPerReq  float64 `json:"cpu_us_per_req"`
	// VsGRPC and VsRaw compare with grpc-go and the raw echo over the same
	// network (unix or tcp) at the same size and concurrency: the median over
	// rounds of this cell's req/s divided by the other's req/s in the same
	// round (pair by pair, so a ratio holds while the machine's speed drifts),
	// with the smallest and largest of those per-round ratios. 0 when that
	// transport was not measured.
	VsGRPC    float64 `json:"vs_grpc,omitempty"`
	VsGRPCMin float64 `json:"vs_grpc_min,omitempty"`
	VsGRPCMax float64 `json:"vs_grpc_max,omitempty"`
	VsRaw     float64 `json:"vs_raw,omitempty"`
	VsRawMin  float64 `json:"vs_raw_min,omitempty"`
	VsRawMax  float64 `json:"vs_raw_max,omitempty"`
	// P50VsRaw is this cell's p50 divided by raw's, round by round: the
	// median with its min and max (above 1 means slower than the floor).
	P50VsRaw    float64 `json:"p50_vs_raw,omitempty"`
	P50VsRawMin float64 `json:"p50_vs_raw_min,omitempty"`
	P50VsRawMax float64 `json:"p50_vs_raw_max,omitempty"`
	// Truncated is set when a sample hit its time cap before all requests were done.
	Truncated bool `json:"truncated,omitempty"`
}

// finish computes ratios and notes.
func (r *Report) finish() {
	find := func(family, network string, size, conc int) *Cell {
		for i := range r.Cells {
			c := &r.Cells[i]
			if c.Family == family && c.Network == network && c.Size == size && c.Conc == conc {
				return c
			}
		}
		return nil
	}
	noisy, trunc := 0, 0
	for i := range r.Cells {
		c := &r.Cells[i]
		if g := find("grpc", c.Network, c.Size, c.Conc); g != nil {
			c.VsGRPC, c.VsGRPCMin, c.VsGRPCMax = pairRatio(c, g)
		}
		if w := find("raw", c.Network, c.Size, c.Conc); w != nil {
			c.VsRaw, c.VsRawMin, c.VsRawMax = pairRatio(c, w)
			c.P50VsRaw, c.P50VsRawMin, c.P50VsRawMax = roundRatio(c.P50Rounds, w.P50Rounds)
		}
		if c.Noisy {
			noisy++
		}
		if c.Truncated {
			trunc++
		}
	}
	if r.Settings.NoisyRetries > 0 {
		repeated, most := 0, 0
		for _, c := range r.Cells {
			if c.ExtraRounds > 0 {
				repeated++
				most = max(most, c.ExtraRounds)
			}
		}
		r.Notes = append(r.Notes, fmt.Sprintf("noisy cells were repeated: %d of %d cells took extra rounds (at most %d of %d allowed, within %s in all); "+
			"each reports its last %d rounds; %d stayed noisy",
			repeated, len(r.Cells), most, r.Settings.NoisyRetries, time.Duration(r.Settings.NoisyRetrySec*float64(time.Second)), r.Settings.Repeat, noisy))
	}
	if noisy > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d of %d cells are NOISY: req/s varied by more than %.0f%% between repeats; "+
			"close other programs, use a longer --duration or more --repeat before trusting their ratios",
			noisy, len(r.Cells), r.Settings.NoisySpread*100))
	}
	if r.Settings.Repeat < 2 {
		r.Notes = append(r.Notes, "single run per cell (--repeat 1): no spread measured; use --repeat 3 or more to see how noisy this machine is")
	}
	if trunc > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d cells hit the time cap before finishing their requests (marked 'cut'): "+
			"the transport slowed down after its warm-up", trunc))
	}
}

// pairRatio divides c's req/s by ref's round by round and returns the median
// ratio and its min and max. Cells without per-round rates (a report decoded
// from an older JSON) fall back to the ratio of the medians.
func pairRatio(c, ref *Cell) (med, lo, hi float64) {
	if len(c.RPSRounds) == 0 || len(c.RPSRounds) != len(ref.RPSRounds) {
		if ref.RPS <= 0 {
			return 0, 0, 0
		}
		r := c.RPS / ref.RPS
		return r, r, r
	}
	return roundRatio(c.RPSRounds, ref.RPSRounds)
}

// roundRatio divides xs by refs element by element (one round each) and
// returns the median ratio and its min and max; zeros when they do not pair.
func roundRatio(xs, refs []float64) (med, lo, hi float64) {
	if len(xs) == 0 || len(xs) != len(refs) {
		return 0, 0, 0
	}
	rs := make([]float64, 0, len(xs))
	for i, x := range xs {
		if refs[i] > 0 {
			rs = append(rs, x/refs[i])
		}
	}
	if len(rs) == 0 {
		return 0, 0, 0
	}
	lo, hi = rs[0], rs[0]
	for _, r := range rs {
		lo, hi = min(lo, r), max(hi, r)
	}
	return stats.Median(rs), lo, hi
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

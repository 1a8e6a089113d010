package bench

import "time"

// Repeating noisy cells (Config.NoisyRetries): after a group's Repeat
// rounds, while the last Repeat rounds of some transport of the group vary
// by more than NoisySpread, the whole group measures one more round (all its
// transports, so that rounds stay paired for the ratios), up to NoisyRetries
// extra rounds per group and until the run's NoisyRetryTime is spent. The
// cells then report their last Repeat rounds: the quietest stretch the
// policy reached, not a mix with the disturbed rounds before it.

// windowSpread is (max-min)/median of the last keep values of rps.
func windowSpread(rps []float64, keep int) float64 {
	if keep > len(rps) {
		keep = len(rps)
	}
	w := rps[len(rps)-keep:]
	if len(w) < 2 {
		return 0
	}
	lo, hi := w[0], w[0]
	for _, r := range w {
		lo, hi = min(lo, r), max(hi, r)
	}
	sorted := append([]float64(nil), w...)
	for i := 1; i < len(sorted); i++ { // a few values: insertion sort
		for j := i; j > 0 && sorted[j] < sorted[j-1]; j-- {
			sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
		}
	}
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	if med <= 0 {
		return 0
	}
	return (hi - lo) / med
}

// retryPolicy decides whether a group measures another round.
type retryPolicy struct {
	keep   int       // rounds a cell reports (Config.Repeat)
	spread float64   // Config.NoisySpread
	max    int       // extra rounds allowed per group (Config.NoisyRetries)
	until  time.Time // the run's time cap for extra rounds
}

// again reports whether a group whose transports measured rounds (req/s per
// round, one slice per transport) after extra extra rounds should measure
// one more at time now.
func (p retryPolicy) again(rounds [][]float64, extra int, now time.Time) bool {
	if p.keep < 2 || extra >= p.max || !now.Before(p.until) {
		return false
	}
	for _, rps := range rounds {
		if len(rps) >= 2 && windowSpread(rps, p.keep) > p.spread {
			return true
		}
	}
	return false
}

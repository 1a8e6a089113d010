//go:build race

package rpc

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts are not meaningful under it.
const raceEnabled = true

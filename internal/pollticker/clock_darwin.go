package pollticker

import "errors"

// openClock: no shared clock on macOS (a kqueue timer would do; nobody has
// measured the need there), so Tickers are time.Tickers.
func openClock() (clock, error) {
	return nil, errors.New("pollticker: no shared clock on this system")
}

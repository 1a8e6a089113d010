package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Config selects the matrix and how each cell is measured. The zero value of
// every field means its documented default.
type Config struct {
	// Transports to compare, by name. Default: every registered one of DefaultTransports.
	Transports []string
	// Sizes are payload sizes in bytes. Default 1 KiB, 10 KiB, 100 KiB, 1 MiB.
	Sizes []int
	// Conc are the concurrency levels: C concurrent callers. Default 1 and 16.
	Conc []int
	// Duration is the target length of one measured sample for the slowest
	// transport of a (size, concurrency) group. Default 2s.
	Duration time.Duration
	// Warmup is how long each transport runs unrecorded before a group is
	// measured; its rate also sizes the request count. Default 500ms; a
	// negative value means a minimal 100ms probe (still unrecorded).
	Warmup time.Duration
	// Repeat is the number of measured samples per cell. Default 1.
	Repeat int
	// Requests, when > 0, fixes the requests per sample instead of sizing
	// them from the warm-up.
	Requests int64
	// Rate, when > 0, is fixed-rate mode: total requests per second across
	// all callers, latency measured from each request's intended send time.
	// The request count is then Rate x Duration.
	Rate float64
	// NoisySpread is the spread ((max-min)/median of req/s over repeats) above
	// which a cell is flagged noisy. Default 0.10.
	NoisySpread float64
	// NoisyRetries is how many extra rounds a (size, concurrency) group may
	// measure while one of its cells is noisy over its last Repeat rounds
	// (bench/retry.go). 0: none (a cell is measured Repeat times).
	NoisyRetries int
	// NoisyRetryTime caps the time all extra rounds of a run take together.
	// Default 60s when NoisyRetries is set.
	NoisyRetryTime time.Duration
	// ServerCmd is the argv that starts a server process; Run appends
	// "--transport T --addr A --ctl C". Required.
	ServerCmd []string
	// ServerEnv is added to the server process's environment.
	ServerEnv []string
	// Progress receives a progress line (carriage-return updated). Nil: none.
	Progress io.Writer
}

// Default sizes, concurrency levels and timings.
var (
	DefaultSizes    = []int{1 << 10, 10 << 10, 100 << 10, 1 << 20}
	DefaultConc     = []int{1, 16}
	DefaultDuration = 2 * time.Second
	DefaultWarmup   = 500 * time.Millisecond
)

// withDefaults returns c with defaults filled in, or an error for values that cannot work.
func (c Config) withDefaults() (Config, error) {
	if len(c.Transports) == 0 {
		var def []string
		for _, n := range DefaultTransports {
			if _, ok := Lookup(n); ok {
				def = append(def, n)
			}
		}
		c.Transports = def
	}
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultSizes
	}
	if len(c.Conc) == 0 {
		c.Conc = DefaultConc
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if c.Repeat == 0 {
		c.Repeat = 1
	}
	if c.NoisySpread == 0 {
		c.NoisySpread = 0.10
	}
	if c.NoisyRetries > 0 && c.NoisyRetryTime == 0 {
		c.NoisyRetryTime = 60 * time.Second
	}
	switch {
	case c.Duration < 0:
		return c, fmt.Errorf("duration %v: must be positive", c.Duration)
	case c.NoisyRetries < 0 || c.NoisyRetries > 100:
		return c, fmt.Errorf("noisy retries %d: want 0..100", c.NoisyRetries)
	case c.Repeat < 0 || c.Repeat > 100:
		return c, fmt.Errorf("repeat %d: want 1..100", c.Repeat)
	case c.Requests < 0:
		return c, fmt.Errorf("requests %d: must be positive", c.Requests)
	case c.Rate < 0:
		return c, fmt.Errorf("rate %v: must be positive", c.Rate)
	case len(c.ServerCmd) == 0:
		return c, fmt.Errorf("bench: Config.ServerCmd is empty")
	}
	for _, s := range c.Sizes {
		if s < 1 || s > MaxFrame {
			return c, fmt.Errorf("size %d: want 1 byte .. %s", s, FormatSize(MaxFrame))
		}
	}
	for _, n := range c.Conc {
		if n < 1 || n > 4096 {
			return c, fmt.Errorf("concurrency %d: want 1..4096", n)
		}
	}
	return c, nil
}

// ParseSize parses "1024", "1k", "1KiB", "10KB", "1m", "1MiB" (binary units).
func ParseSize(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1
	for _, suf := range []struct {
		s string
		m int
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"kb", 1 << 10}, {"mb", 1 << 20}, {"k", 1 << 10}, {"m", 1 << 20}, {"b", 1}} {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, suf.s)), suf.m
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("size %q: want a positive number of bytes, optionally with k/KiB or m/MiB", s)
	}
	if n > MaxFrame/mult {
		return 0, fmt.Errorf("size %q: over the %s cap", s, FormatSize(MaxFrame))
	}
	return n * mult, nil
}

// ParseSizes parses a comma-separated list of sizes.
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes in %q", s)
	}
	return out, nil
}

// FormatSize prints a size as "1KiB", "100KiB", "1MiB" or "300B".
func FormatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// Payload returns the benchmark payload of n bytes: printable ASCII
// ('a'..'z' repeating), identical for every transport.
func Payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

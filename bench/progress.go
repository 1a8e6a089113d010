package bench

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress prints "cell i/n ... ETA" on cfg.Progress: updated in place on a
// terminal, one line per step otherwise.
type progress struct {
	cfg      Config
	w        io.Writer
	tty      bool
	cells    int // transports x sizes x conc
	samples  int // cells x repeat
	done     int // samples done
	warmLeft int
	started  time.Time
	measured time.Duration // time spent in samples so far
}

func newProgress(cfg Config, ntransports int) *progress {
	groups := len(cfg.Sizes) * len(cfg.Conc)
	p := &progress{cfg: cfg, w: cfg.Progress, cells: groups * ntransports, samples: groups * ntransports * cfg.Repeat,
		warmLeft: groups * ntransports, started: time.Now()}
	if f, ok := cfg.Progress.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) eta() time.Duration {
	wu := effectiveWarmup(p.cfg)
	per := p.cfg.Duration
	if p.done > 0 {
		per = p.measured / time.Duration(p.done)
	}
	return time.Duration(p.warmLeft)*wu + time.Duration(p.samples-p.done)*per
}

// show prints the line for cell (1-based) with a label.
func (p *progress) show(cell int, label string) {
	if p.w == nil {
		return
	}
	line := fmt.Sprintf("cell %d/%d  %s  elapsed %s  ETA %s", cell, p.cells, label,
		time.Since(p.started).Round(time.Second), p.eta().Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

func (p *progress) warmed()                  { p.warmLeft-- }
func (p *progress) sampled(el time.Duration) { p.done++; p.measured += el }

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "done: %d cells, %d samples in %s\n", p.cells, p.samples, time.Since(p.started).Round(time.Millisecond))
}

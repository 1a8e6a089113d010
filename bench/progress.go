package bench

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress prints "step k/n ... ETA" on cfg.Progress: updated in place on a
// terminal, one line per step otherwise. Steps are every warm-up and every
// measured sample, in the order they run, so k only goes up; the ETA never
// goes up either.
type progress struct {
	cfg      Config
	w        io.Writer
	tty      bool
	cells    int // transports x sizes x conc
	steps    int // warm-ups + samples
	step     int // steps started
	samples  int // cells x repeat
	perGroup int // samples per (size, conc) group: transports x repeat
	done     int // samples done
	warmLeft int
	started  time.Time
	// groupDone and groupTime: samples finished in the current (size, conc)
	// group and the time they took; they predict the rest of the group.
	groupDone int
	groupTime time.Duration
	lastETA   time.Duration
	lastAt    time.Time
}

func newProgress(cfg Config, ntransports int) *progress {
	groups := len(cfg.Sizes) * len(cfg.Conc)
	cells := groups * ntransports
	p := &progress{cfg: cfg, w: cfg.Progress, cells: cells, samples: cells * cfg.Repeat,
		steps: cells + cells*cfg.Repeat, perGroup: ntransports * cfg.Repeat, warmLeft: cells, started: time.Now(), lastETA: -1}
	if f, ok := cfg.Progress.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// estimate is the time left: warm-ups at their fixed length, the current
// group's remaining samples at its average so far, and every later sample at
// cfg.Duration (only the slowest transport of a group takes that long, so it
// errs high and the estimate mostly falls faster than the clock).
func (p *progress) estimate() time.Duration {
	left := time.Duration(p.warmLeft) * effectiveWarmup(p.cfg)
	rest := p.samples - p.done
	inGroup := 0
	if p.groupDone > 0 {
		inGroup = min(rest, p.perGroup-p.groupDone)
		left += time.Duration(inGroup) * (p.groupTime / time.Duration(p.groupDone))
	}
	return left + time.Duration(rest-inGroup)*p.cfg.Duration
}

// eta is the estimate, clamped so that it never rises: a countdown from the
// previous value when the new estimate is higher.
func (p *progress) eta() time.Duration {
	now := time.Now()
	e := p.estimate()
	if p.lastETA >= 0 {
		if down := p.lastETA - now.Sub(p.lastAt); e > down {
			e = max(down, 0)
		}
	}
	p.lastETA, p.lastAt = e, now
	return e
}

// show starts the next step and prints its line.
func (p *progress) show(label string) {
	p.step++
	if p.w == nil {
		return
	}
	line := fmt.Sprintf("step %d/%d  %s  elapsed %s  ETA %s", p.step, p.steps, label,
		time.Since(p.started).Round(time.Second), p.eta().Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// group starts a new (size, conc) group.
func (p *progress) group() { p.groupDone, p.groupTime = 0, 0 }

func (p *progress) warmed() { p.warmLeft-- }

func (p *progress) sampled(el time.Duration) {
	p.done++
	p.groupDone++
	p.groupTime += el
}

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "done: %d cells, %d samples in %s\n", p.cells, p.samples, time.Since(p.started).Round(time.Millisecond))
}

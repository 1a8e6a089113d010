package bench

import (
	"bytes"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// colors per family: unix is the darker shade, tcp the lighter one.
var familyColors = map[string][2]string{
	"rpc":       {"#1f4e9c", "#7fa7e6"},
	"shm":       {"#0b7a5a", "#7fd3b6"},
	"grpc":      {"#c25400", "#f5a55c"},
	"raw":       {"#2a7d2e", "#8fd18f"},
	"rawframed": {"#5c7d2a", "#bcd18f"},
	"ndjson":    {"#6b3fa0", "#b99ae0"},
}

func transportColor(family, network string, i int) string {
	if c, ok := familyColors[family]; ok {
		if network == "tcp" {
			return c[1]
		}
		return c[0]
	}
	other := []string{"#555555", "#999999", "#8c564b", "#e377c2"}
	return other[i%len(other)]
}

type logAxis struct{ lo, hi float64 } // log10 of the axis' ends

// newLogAxis spans the values with a margin on both sides: the smallest bar
// is at least a tenth of the panel tall (an axis starting at the power of ten
// below it drew a value just above that power as a sliver), and the largest
// leaves room for its value label.
func newLogAxis(vals []float64) logAxis {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return logAxis{0, 1}
	}
	l, h := math.Log10(lo), math.Log10(hi)
	span := math.Max(h-l, 0.3)
	return logAxis{l - span/6, h + span/5}
}

// ticks are the gridline values: 1, 2 and 5 times each power of ten inside
// the axis (1 and 10 only when the axis spans more than three decades).
func (a logAxis) ticks() []float64 {
	mults := []float64{1, 2, 5}
	if a.hi-a.lo > 3 {
		mults = []float64{1}
	}
	var out []float64
	for d := math.Floor(a.lo); d <= math.Ceil(a.hi); d++ {
		for _, m := range mults {
			v := m * math.Pow(10, d)
			if l := math.Log10(v); l >= a.lo && l <= a.hi {
				out = append(out, v)
			}
		}
	}
	return out
}

// frac maps v to 0 (bottom) .. 1 (top).
func (a logAxis) frac(v float64) float64 {
	if v <= 0 {
		return 0
	}
	f := (math.Log10(v) - a.lo) / (a.hi - a.lo)
	return math.Max(0, math.Min(1, f))
}

func siLabel(v float64) string { return scaledLabel(v, "", "k", "M") }

func latLabel(us float64) string { return scaledLabel(us, "µs", "ms", "s") }

// scaledLabel prints v with unit, or v/1e3 with unit3, or v/1e6 with unit6,
// to three significant digits.
func scaledLabel(v float64, unit, unit3, unit6 string) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3g%s", v/1e6, unit6)
	case v >= 1e3:
		return fmt.Sprintf("%.3g%s", v/1e3, unit3)
	}
	return fmt.Sprintf("%.3g%s", v, unit)
}

// WriteSVG draws the report: for each concurrency level a row with two
// panels, requests/s and p99 latency, each with one group of bars per payload
// size and one bar per transport, on log scales.
func (r *Report) WriteSVG(w io.Writer) error {
	sizes, concs, trs := r.Settings.Sizes, r.Settings.Conc, r.Settings.Transports
	if len(r.Cells) == 0 {
		return errors.New("chart: no cells")
	}
	cell := func(t string, size, conc int) *Cell {
		for i := range r.Cells {
			c := &r.Cells[i]
			if c.Transport == t && c.Size == size && c.Conc == conc {
				return c
			}
		}
		return nil
	}
	colors := map[string]string{}
	for i, t := range trs {
		fam, netw := "", ""
		if tr, ok := Lookup(t); ok {
			fam, netw = tr.Family, tr.Network
		} else {
			for _, c := range r.Cells {
				if c.Transport == t {
					fam, netw = c.Family, c.Network
				}
			}
		}
		colors[t] = transportColor(fam, netw, i)
	}
	const (
		panelW, panelH = 520, 300
		left, gap      = 80, 60
		top            = 110
		rowGap         = 90
	)
	W := left + 2*panelW + gap + 30
	H := top + len(concs)*(panelH+rowGap) + 10
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n", W, H, W, H)
	p(`<defs><pattern id="noisy" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">` +
		`<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2" stroke-opacity="0.7"/></pattern></defs>` + "\n")
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	s := r.System
	p(`<text x="%d" y="24" font-size="17" font-weight="bold">udskit bench: echo requests/s (higher is better) and p99 latency (lower is better)</text>`+"\n", left)
	p(`<text x="%d" y="44" fill="#444">%s</text>`+"\n", left, html.EscapeString(fmt.Sprintf(
		"%s, %d cores, kernel %s, clocksource %s, %s; %gs per cell, repeat %d",
		s.CPU, s.Cores, s.Kernel, s.Clocksource, s.GoVersion, r.Settings.DurationSec, r.Settings.Repeat)))
	// legend
	lx := left
	for _, t := range trs {
		p(`<rect x="%d" y="60" width="14" height="14" fill="%s"/><text x="%d" y="72">%s</text>`+"\n", lx, colors[t], lx+18, html.EscapeString(t))
		lx += 28 + 8*len(t)
	}
	legend := "darker = unix socket, lighter = tcp loopback; log scales; whiskers: req/s min-max over rounds"
	noisy := 0
	for _, c := range r.Cells {
		if c.Noisy {
			noisy++
		}
	}
	if noisy > 0 {
		legend += fmt.Sprintf("; %d of %d cells NOISY (hatched, value marked *: spread > %.0f%%)",
			noisy, len(r.Cells), r.Settings.NoisySpread*100)
	}
	p(`<text x="%d" y="94" fill="#444">%s</text>`+"\n", left, html.EscapeString(legend))

	for ri, conc := range concs {
		y0 := top + ri*(panelH+rowGap) + 20
		for pi := 0; pi < 2; pi++ {
			x0 := left + pi*(panelW+gap)
			var vals []float64
			for _, c := range r.Cells {
				if c.Conc == conc {
					if pi == 0 {
						vals = append(vals, c.RPS)
					} else {
						vals = append(vals, c.P99us)
					}
				}
			}
			ax := newLogAxis(vals)
			title := fmt.Sprintf("requests/s, %d concurrent caller(s)", conc)
			label, fmtTick := "requests per second", siLabel
			if pi == 1 {
				title = fmt.Sprintf("p99 latency, %d concurrent caller(s)", conc)
				label, fmtTick = "p99 latency", latLabel
			}
			p(`<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", x0, y0-8, title)
			// grid and ticks
			for _, v := range ax.ticks() {
				y := float64(y0+panelH) - ax.frac(v)*panelH
				p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+panelW, y)
				p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, fmtTick(v))
			}
			p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", x0, y0, x0, y0+panelH)
			p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", x0, y0+panelH, x0+panelW, y0+panelH)
			p(`<text transform="translate(%d,%d) rotate(-90)" text-anchor="middle" fill="#444">%s (log)</text>`+"\n", x0-58, y0+panelH/2, label)
			p(`<text x="%d" y="%d" text-anchor="middle" fill="#444">payload size (bytes each way)</text>`+"\n", x0+panelW/2, y0+panelH+38)
			groupW := float64(panelW) / float64(len(sizes))
			barW := groupW * 0.8 / float64(len(trs))
			for si, size := range sizes {
				gx := float64(x0) + float64(si)*groupW + groupW*0.1
				p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", gx+groupW*0.4, y0+panelH+18, FormatSize(size))
				for ti, t := range trs {
					c := cell(t, size, conc)
					if c == nil {
						continue
					}
					v := c.RPS
					if pi == 1 {
						v = c.P99us
					}
					h := ax.frac(v) * panelH
					x := gx + float64(ti)*barW
					bw := math.Max(barW-1, 1)
					base := float64(y0 + panelH)
					tip := fmt.Sprintf("%s %s c=%d: %s req/s, p99 %s", t, FormatSize(size), conc, FormatRate(c.RPS), FormatLatency(c.P99us))
					if c.Noisy {
						tip += fmt.Sprintf(" (NOISY: req/s spread %.0f%%)", c.Spread*100)
					}
					p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
						x, base-h, bw, h, colors[t], html.EscapeString(tip))
					if c.Noisy {
						p(`<rect class="noisy" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#noisy)"/>`+"\n", x, base-h, bw, h)
					}
					top := base - h
					if pi == 0 && c.Repeats > 1 && c.RPSMax > c.RPSMin {
						ylo, yhi := base-ax.frac(c.RPSMin)*panelH, base-ax.frac(c.RPSMax)*panelH
						cx := x + bw/2
						p(`<path d="M%.1f %.1fV%.1fM%.1f %.1fh%.1fM%.1f %.1fh%.1f" stroke="#222" fill="none"/>`+"\n",
							cx, ylo, yhi, cx-2, ylo, 4.0, cx-2, yhi, 4.0)
						top = math.Min(top, yhi)
					}
					lbl, fill := fmtTick(v), "#222"
					if c.Noisy {
						lbl, fill = lbl+"*", "#b00000"
					}
					p(`<text transform="translate(%.1f,%.1f) rotate(-90)" font-size="9" fill="%s">%s</text>`+"\n",
						x+bw/2+3, top-3, fill, html.EscapeString(lbl))
				}
			}
		}
	}
	p("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// WriteChartFile writes the chart to path: SVG, or PNG (by extension) when
// rsvg-convert is installed to render the SVG.
func (r *Report) WriteChartFile(path string) error {
	var b bytes.Buffer
	if err := r.WriteSVG(&b); err != nil {
		return err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		return os.WriteFile(path, b.Bytes(), 0o644)
	case ".png":
		conv, err := exec.LookPath("rsvg-convert")
		if err != nil {
			return fmt.Errorf("chart %s: PNG output needs rsvg-convert (Debian: apt-get install librsvg2-bin); or write .svg", path)
		}
		cmd := exec.Command(conv, "-f", "png", "-b", "white", "-o", path)
		cmd.Stdin = &b
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("chart %s: rsvg-convert: %v: %s", path, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return fmt.Errorf("chart %s: want a .svg or .png file name", path)
}

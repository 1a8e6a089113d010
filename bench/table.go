package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// FormatLatency prints microseconds as "12.3µs", "1.24ms" or "1.50s".
func FormatLatency(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%.1fµs", us)
	case us < 1e6:
		return fmt.Sprintf("%.2fms", us/1e3)
	}
	return fmt.Sprintf("%.2fs", us/1e6)
}

// FormatRate prints requests/s with thousands grouping ("12,345").
func FormatRate(r float64) string {
	s := fmt.Sprintf("%.0f", r)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ratio prints a median pairwise ratio, with its per-round range when the
// cell had more than one round.
func ratio(x, lo, hi float64, rounds int) string {
	if x == 0 {
		return "-"
	}
	if rounds < 2 || lo == hi {
		return fmt.Sprintf("%.2fx", x)
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", x, lo, hi)
}

// WriteHeader writes the machine and settings lines that head a table.
func (r *Report) WriteHeader(w io.Writer) {
	s := r.System
	fmt.Fprintf(w, "udskit bench  %s  kernel %s %s/%s  CPU %s (%d cores)  clocksource %s\n",
		s.GoVersion, s.Kernel, s.OS, s.Arch, s.CPU, s.Cores, s.Clocksource)
	if s.MemcpyGBps > 0 {
		fmt.Fprintf(w, "memcpy of 1 MiB, one thread, in this run: %.1f GB/s (the physical reference for the shared-memory rows)\n", s.MemcpyGBps)
	}
	st := r.Settings
	mode := "closed loop (each caller sends its next request when the previous answer arrives)"
	if st.Rate > 0 {
		mode = fmt.Sprintf("fixed rate %.0f req/s total (latency from intended send time)", st.Rate)
	}
	count := "requests per cell sized so the slowest transport runs ~duration; identical for every transport"
	if st.Requests > 0 {
		count = fmt.Sprintf("%d requests per cell for every transport", st.Requests)
	}
	fmt.Fprintf(w, "duration %s  warm-up %s (not recorded)  repeat %d  %s\n%s\n",
		time.Duration(st.DurationSec*float64(time.Second)), time.Duration(st.WarmupSec*float64(time.Second)),
		st.Repeat, mode, count)
}

// WriteTable writes the header, an aligned table of every cell (grouped by
// concurrency and size) and the notes.
func (r *Report) WriteTable(w io.Writer) error {
	r.WriteHeader(w)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tsize\tconc\treq/s\tspread\tp50\tp99\tp99.9\tallocs/req cli\tsrv\tcpu µs/req\tvs grpc\tvs raw\tp50 vs raw\tnote\t")
	var last [2]int
	for i, c := range r.Cells {
		if i > 0 && (c.Conc != last[0] || c.Size != last[1]) {
			fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t")
		}
		last = [2]int{c.Conc, c.Size}
		spread, note := c.spreadAndNote("NOISY")
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t\n",
			c.Transport, FormatSize(c.Size), c.Conc, FormatRate(c.RPS), spread,
			FormatLatency(c.P50us), FormatLatency(c.P99us), FormatLatency(c.P999us),
			c.ClientAllocsPerReq, c.ServerAllocsPerReq, c.CPUusPerReq,
			ratio(c.VsGRPC, c.VsGRPCMin, c.VsGRPCMax, c.Repeats), ratio(c.VsRaw, c.VsRawMin, c.VsRawMax, c.Repeats),
			ratio(c.P50VsRaw, 0, 0, 1), note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "req/s: median over repeats; spread: (max-min)/median over repeats; p50/p99/p99.9: all measured requests, HDR histogram;")
	fmt.Fprintln(w, "allocs/req: heap allocations per request in the client and server processes; cpu µs/req: client+server CPU;")
	fmt.Fprintln(w, "vs grpc / vs raw: req/s divided by grpc-go's / the raw fixed-size echo's (the floor) over the same network (unix or tcp),")
	fmt.Fprintln(w, "same size and conc, round by round (the transports of a cell run one after another in each round); median (min-max) over rounds;")
	fmt.Fprintln(w, "p50 vs raw: p50 latency divided by the raw echo's, round by round, median (above 1: slower than the floor).")
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

// spreadAndNote is a cell's spread column ("-" for a single round) and its
// note column (noisy, in the given word, and cut), as both tables print them.
func (c *Cell) spreadAndNote(noisy string) (spread, note string) {
	spread = "-"
	if c.Repeats > 1 {
		spread = fmt.Sprintf("%.0f%%", c.Spread*100)
	}
	var notes []string
	if c.Noisy {
		notes = append(notes, noisy)
	}
	if c.Truncated {
		notes = append(notes, "cut")
	}
	return spread, strings.Join(notes, ",")
}

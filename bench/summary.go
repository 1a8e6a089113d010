package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// CompactWidth is the widest line WriteCompact writes (columns).
const CompactWidth = 100

// WriteCompact writes what `make demo` shows: a three-line summary first,
// then one short row per cell (transport, size, req/s, spread, p50, p99, vs
// grpc, vs raw, note) and a legend, every line at most CompactWidth columns.
// The JSON (WriteJSON) holds everything else: allocations, CPU, p99.9,
// per-round values.
func (r *Report) WriteCompact(w io.Writer) error {
	for _, l := range r.Summary() {
		fmt.Fprintln(w, clip(l))
	}
	sys := r.System
	fmt.Fprintln(w, clip(fmt.Sprintf("(%s, kernel %s, %s, %d cores; %s per cell)", sys.GoVersion, sys.Kernel, sys.CPU, sys.Cores,
		time.Duration(r.Settings.DurationSec*float64(time.Second)))))
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tsize\treq/s\tspread\tp50\tp99\tvs grpc\tvs raw\tnote\t")
	var last [2]int
	for i, c := range r.Cells {
		if i > 0 && (c.Conc != last[0] || c.Size != last[1]) {
			fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t\t")
		}
		last = [2]int{c.Conc, c.Size}
		spread, note := c.spreadAndNote("noisy")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Transport, FormatSize(c.Size), FormatRate(c.RPS), spread,
			FormatLatency(c.P50us), FormatLatency(c.P99us), short(c.VsGRPC), short(c.VsRaw), note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, l := range []string{
		fmt.Sprintf("%d concurrent callers; req/s: median of %d rounds; spread: (max-min)/median, noisy over %.0f%%.",
			r.concurrency(), r.Settings.Repeat, r.Settings.NoisySpread*100),
		"vs grpc / vs raw: req/s over grpc-go's / the raw echo's, same network, size and round (median).",
		"Why rpc can beat raw (above 1x): raw is the floor per request, each caller on its own connection",
		"with one write and one read per request; rpc multiplexes small calls over 2 connections and",
		"moves many requests per read and write: fewer syscalls and wake-ups under concurrency.",
		"Alone (1 caller), rpc stays at or below raw; big calls get a connection each, as raw's do.",
		"Everything else (allocs, CPU, p99.9, each round) is in the JSON; docs/bench.md explains it.",
	} {
		fmt.Fprintln(w, clip(l))
	}
	return nil
}

// Summary is three lines: rpc against grpc-go, against the raw echo, and
// unix against tcp, each over the sizes measured (unix where both ran).
func (r *Report) Summary() []string {
	var vsGRPC, vsRaw, unixTCP []float64
	var sizes []int
	noisy, repeated := 0, 0
	for _, c := range r.Cells {
		if c.Noisy {
			noisy++
		}
		if c.ExtraRounds > 0 {
			repeated++
		}
		if c.Family != "rpc" || c.Network != "unix" {
			continue
		}
		sizes = append(sizes, c.Size)
		if c.VsGRPC > 0 {
			vsGRPC = append(vsGRPC, c.VsGRPC)
		}
		if c.VsRaw > 0 {
			vsRaw = append(vsRaw, c.VsRaw)
		}
		for _, t := range r.Cells {
			if t.Family == "rpc" && t.Network == "tcp" && t.Size == c.Size && t.Conc == c.Conc && t.RPS > 0 {
				unixTCP = append(unixTCP, c.RPS/t.RPS)
			}
		}
	}
	what := "sizes " + sizeList(sizes)
	out := []string{
		"udskit rpc over unix vs grpc-go: " + span(vsGRPC) + " the requests/s (" + what + ")",
		"udskit rpc vs the raw echo (the floor): " + span(vsRaw) + " the requests/s (above 1x: see below)",
		"udskit rpc over unix vs over tcp: " + span(unixTCP) + " the requests/s",
	}
	if r.Settings.NoisyRetries > 0 {
		// Short, to fit CompactWidth; the notes say more.
		out[2] += fmt.Sprintf("; repeats: %d cells, %d still noisy", repeated, noisy)
	} else if noisy > 0 {
		out[2] += fmt.Sprintf("; %d of %d cells noisy: rerun when idle", noisy, len(r.Cells))
	}
	return out
}

func (r *Report) concurrency() int {
	if len(r.Cells) == 0 {
		return 0
	}
	return r.Cells[0].Conc
}

// span is "2.10x" or "1.90x-3.40x" (min-max), "not measured" when empty.
func span(xs []float64) string {
	if len(xs) == 0 {
		return "not measured:"
	}
	sort.Float64s(xs)
	if xs[0] == xs[len(xs)-1] {
		return fmt.Sprintf("%.2fx", xs[0])
	}
	return fmt.Sprintf("%.2fx-%.2fx", xs[0], xs[len(xs)-1])
}

func sizeList(sizes []int) string {
	s := make([]string, len(sizes))
	for i, n := range sizes {
		s[i] = FormatSize(n)
	}
	return strings.Join(s, ", ")
}

func short(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

// clip cuts a line to CompactWidth columns.
func clip(s string) string {
	r := []rune(s)
	if len(r) <= CompactWidth {
		return s
	}
	return string(r[:CompactWidth-3]) + "..."
}

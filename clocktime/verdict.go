package clocktime

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// System is what the kernel and firmware say about the clocks.
type System struct {
	// Clocksource is the current clocksource (clocksource0/current_clocksource).
	Clocksource string `json:"clocksource"`
	// Available lists available_clocksource.
	Available []string `json:"available"`
	// TSC, ConstantTSC and NonstopTSC are cpuinfo flags: a TSC exists, runs at
	// a constant rate, and keeps running in deep C-states. Both of the last two
	// are needed for the TSC to be a stable clocksource.
	TSC         bool `json:"tsc"`
	ConstantTSC bool `json:"constant_tsc"`
	NonstopTSC  bool `json:"nonstop_tsc"`
	// VM is true when a hypervisor is detected; VMHow says from what.
	VM    bool   `json:"vm"`
	VMHow string `json:"vm_evidence,omitempty"`
}

// Input is everything Decide looks at: recorded on a machine, replayable in tests.
type Input struct {
	System
	// VDSONs is the cost of one CLOCK_MONOTONIC read the way programs do it (vDSO path).
	VDSONs float64 `json:"vdso_ns"`
	// SyscallNs is the cost of one forced clock_gettime(CLOCK_MONOTONIC) system call.
	SyscallNs float64 `json:"syscall_ns"`
	// Backwards is the number of times CLOCK_MONOTONIC went backwards.
	Backwards int64 `json:"backwards"`
}

// Verdict is the plain-words conclusion.
type Verdict struct {
	// Level is "fast" or "slow".
	Level string `json:"level"`
	// Summary is one line.
	Summary string `json:"summary"`
	// Meaning says what it costs in practice.
	Meaning string `json:"meaning"`
	// Fix is what to do ("" when nothing is needed).
	Fix string `json:"fix,omitempty"`
	// ExplainAnalyze20k is the clock overhead EXPLAIN ANALYZE adds to a plan
	// node that produces 20,000 rows: 20,000 rows x 2 clock reads (start and
	// stop of the node per row) x the cost of one read.
	ExplainAnalyze20k time.Duration `json:"explain_analyze_20k_rows_ns"`
	// FellBack is true when vDSO reads cost about as much as a system call.
	FellBack bool `json:"vdso_fell_back"`
}

// Thresholds of the verdict.
const (
	// SlowReadNs: a clock read slower than this is "slow" even through the
	// vDSO (a TSC read is ~15-40 ns; kvm-clock ~30-60 ns; hpet ~500-1500 ns).
	SlowReadNs = 200
	// FallbackRatio: vDSO cost >= this fraction of the syscall cost means the
	// vDSO is doing the system call.
	FallbackRatio = 0.6
	// ExplainRows is the row count the verdict prices EXPLAIN ANALYZE for.
	ExplainRows = 20000
)

// slowSources cannot be read from user space by the x86 vDSO, so every read
// is a system call plus a slow hardware access.
var slowSources = []string{"hpet", "acpi_pm", "jiffies", "pit"}

// ExplainAnalyzeCost is the clock overhead for rows rows through one plan
// node: 2 clock reads per row (InstrStartNode and InstrStopNode).
func ExplainAnalyzeCost(rows int, readNs float64) time.Duration {
	return time.Duration(float64(rows) * 2 * readNs)
}

// Decide turns recorded inputs into a verdict. It is a pure function.
func Decide(in Input) Verdict {
	v := Verdict{ExplainAnalyze20k: ExplainAnalyzeCost(ExplainRows, in.VDSONs)}
	v.FellBack = in.SyscallNs > 0 && in.VDSONs >= FallbackRatio*in.SyscallNs
	src := in.Clocksource
	if src == "" {
		src = "unknown"
	}
	slowSrc := slices.Contains(slowSources, src)
	cost := fmt.Sprintf("%.0f ns per clock read", in.VDSONs)
	v.Meaning = fmt.Sprintf("EXPLAIN ANALYZE adds about %s to a plan node that returns %d rows "+
		"(%d rows x 2 clock reads x %.0f ns); tracing, metrics and logging timestamps pay the same per call",
		roundDur(v.ExplainAnalyze20k), ExplainRows, ExplainRows, in.VDSONs)
	switch {
	case slowSrc:
		v.Level = "slow"
		v.Summary = fmt.Sprintf("slow: clocksource %s cannot be read through the vDSO, so every clock read is a system call plus a slow hardware read (%s)", src, cost)
	case v.FellBack:
		v.Level = "slow"
		v.Summary = fmt.Sprintf("slow: clock reads fall off the vDSO onto a system call with clocksource %s (%s, a forced syscall costs %.0f ns)", src, cost, in.SyscallNs)
	case in.VDSONs >= SlowReadNs:
		v.Level = "slow"
		v.Summary = fmt.Sprintf("slow: clock reads go through the vDSO but cost %s with clocksource %s", cost, src)
	default:
		v.Level = "fast"
		v.Summary = fmt.Sprintf("fast: clock reads go through the vDSO (%s, clocksource %s)", cost, src)
	}
	if in.Backwards > 0 {
		v.Summary += fmt.Sprintf("; CLOCK_MONOTONIC went backwards %d times (a broken clocksource: report it)", in.Backwards)
		if v.Level == "fast" {
			v.Level = "slow"
		}
	}
	if v.Level == "fast" {
		v.Meaning += "; nothing to fix"
		return v
	}
	v.Fix = fixFor(in)
	return v
}

func fixFor(in Input) string {
	var fix []string
	tscAvail := slices.Contains(in.Available, "tsc")
	stable := in.ConstantTSC && in.NonstopTSC
	switch {
	case in.Clocksource != "tsc" && tscAvail && stable:
		fix = append(fix, "the TSC is available and stable (constant_tsc, nonstop_tsc): switch to it now with "+
			"'echo tsc | sudo tee /sys/devices/system/clocksource/clocksource0/current_clocksource', "+
			"and for good by booting with clocksource=tsc on the kernel command line")
	case in.Clocksource != "tsc" && in.TSC && stable && !tscAvail:
		fix = append(fix, "the CPU has a stable TSC but the kernel marked it unusable (see 'dmesg | grep -i tsc'); "+
			"if the kernel only distrusted it at boot, boot with clocksource=tsc tsc=reliable")
	case in.Clocksource != "tsc" && in.TSC && !stable:
		fix = append(fix, "the TSC is not stable here (constant_tsc/nonstop_tsc missing), so do not force clocksource=tsc; "+
			"fix the clock at its source")
	case in.Clocksource == "tsc":
		fix = append(fix, "the clocksource is already tsc: check for a seccomp or ptrace layer that traps clock_gettime, "+
			"or a kernel built without the vDSO")
	}
	if in.VM {
		fix = append(fix, "in a VM, give the guest a paravirtual or invariant clock (kvm-clock, Hyper-V TSC page, "+
			"invariant TSC passthrough); Docker Desktop switches clocksource after time-drift resyncs: restart its VM")
	}
	fix = append(fix, "meanwhile, in PostgreSQL use EXPLAIN (ANALYZE, TIMING OFF) to get row counts without per-row clock reads")
	return strings.Join(fix, "; ")
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

package clocktime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Recorded inputs. The figures are from the kinds of machines named (the
// hpet/xen ones from published pg_test_timing runs and seed 004).
var (
	fastTSC = Input{
		System: System{Clocksource: "tsc", Available: []string{"tsc", "hpet", "acpi_pm"},
			TSC: true, ConstantTSC: true, NonstopTSC: true},
		VDSONs: 19, SyscallNs: 310,
	}
	hpetMachine = Input{
		System: System{Clocksource: "hpet", Available: []string{"hpet", "acpi_pm", "tsc"},
			TSC: true, ConstantTSC: true, NonstopTSC: true},
		VDSONs: 1180, SyscallNs: 1210,
	}
	// EC2 Xen instance: clocksource xen, vDSO falls back to the syscall.
	syscallFallback = Input{
		System: System{Clocksource: "xen", Available: []string{"xen", "tsc", "hpet", "acpi_pm"},
			TSC: true, ConstantTSC: true, NonstopTSC: true, VM: true, VMHow: "hypervisor type xen"},
		VDSONs: 520, SyscallNs: 545,
	}
	// Docker Desktop for Mac from seed 004: hpet after a time-drift resync, 6853 ns per read.
	dockerDesktop = Input{
		System: System{Clocksource: "hpet", Available: []string{"hpet", "acpi_pm"},
			TSC: true, VM: true, VMHow: "cpu flag hypervisor"},
		VDSONs: 6853, SyscallNs: 6900,
	}
)

func TestDecideFastTSC(t *testing.T) {
	v := Decide(fastTSC)
	if v.Level != "fast" || v.FellBack || v.Fix != "" {
		t.Fatalf("%+v", v)
	}
	if v.ExplainAnalyze20k != 760*time.Microsecond { // 20000 x 2 x 19 ns
		t.Errorf("explain cost %v", v.ExplainAnalyze20k)
	}
	if !strings.Contains(v.Summary, "vDSO") || !strings.Contains(v.Meaning, "nothing to fix") {
		t.Errorf("%+v", v)
	}
}

func TestDecideHPET(t *testing.T) {
	v := Decide(hpetMachine)
	if v.Level != "slow" || !strings.Contains(v.Summary, "hpet") {
		t.Fatalf("%+v", v)
	}
	if v.ExplainAnalyze20k != 47200*time.Microsecond { // 20000 x 2 x 1180 ns
		t.Errorf("explain cost %v", v.ExplainAnalyze20k)
	}
	if !strings.Contains(v.Fix, "clocksource=tsc") || !strings.Contains(v.Fix, "current_clocksource") {
		t.Errorf("fix does not switch to tsc: %s", v.Fix)
	}
}

func TestDecideSyscallFallback(t *testing.T) {
	v := Decide(syscallFallback)
	if v.Level != "slow" || !v.FellBack || !strings.Contains(v.Summary, "system call") || !strings.Contains(v.Summary, "xen") {
		t.Fatalf("%+v", v)
	}
	if !strings.Contains(v.Fix, "clocksource=tsc") || !strings.Contains(v.Fix, "VM") {
		t.Errorf("fix: %s", v.Fix)
	}
}

func TestDecideUnstableTSCDoesNotForceTSC(t *testing.T) {
	v := Decide(dockerDesktop)
	if v.Level != "slow" || v.ExplainAnalyze20k != 274120*time.Microsecond {
		t.Fatalf("%+v", v)
	}
	if strings.Contains(v.Fix, "booting with clocksource=tsc") || !strings.Contains(v.Fix, "not stable") ||
		!strings.Contains(v.Fix, "Docker Desktop") || !strings.Contains(v.Fix, "TIMING OFF") {
		t.Errorf("fix: %s", v.Fix)
	}
}

func TestDecideBackwardsIsNeverFast(t *testing.T) {
	in := fastTSC
	in.Backwards = 3
	if v := Decide(in); v.Level != "slow" || !strings.Contains(v.Summary, "backwards 3 times") {
		t.Fatalf("%+v", v)
	}
}

func TestReadSystemRecorded(t *testing.T) {
	sys, proc := t.TempDir(), t.TempDir()
	write := func(root, p, s string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(sys, "devices/system/clocksource/clocksource0/current_clocksource", "kvm-clock\n")
	write(sys, "devices/system/clocksource/clocksource0/available_clocksource", "kvm-clock tsc acpi_pm \n")
	write(sys, "class/dmi/id/sys_vendor", "QEMU\n")
	write(proc, "cpuinfo", "processor\t: 0\nflags\t\t: fpu tsc constant_tsc hypervisor\n\nprocessor\t: 1\nflags\t\t: fpu\n")
	s := ReadSystem(sys, proc)
	if s.Clocksource != "kvm-clock" || len(s.Available) != 3 || !s.TSC || !s.ConstantTSC || s.NonstopTSC ||
		!s.VM || !strings.Contains(s.VMHow, "QEMU") || !strings.Contains(s.VMHow, "hypervisor") {
		t.Fatalf("%+v", s)
	}
	// Nothing readable: empty, no VM claimed.
	if s := ReadSystem(t.TempDir(), t.TempDir()); s.VM || s.Clocksource != "" {
		t.Fatalf("%+v", s)
	}
}

func TestRunPlausible(t *testing.T) {
	r, err := Run(context.Background(), Options{Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]ClockCost{}
	for _, c := range r.Costs {
		byName[c.Name] = c
		if c.Error == "" && (c.NsPerCall <= 0 || c.NsPerCall > 100_000) {
			t.Errorf("implausible %s: %.1f ns", c.Name, c.NsPerCall)
		}
	}
	mono := byName["monotonic (vDSO, time.Since)"]
	if mono.NsPerCall <= 0 {
		t.Fatalf("no vDSO row: %+v", r.Costs)
	}
	if sc, ok := byName["MONOTONIC (syscall)"]; ok {
		// A real system call is never cheaper than the vDSO by more than noise.
		if sc.NsPerCall < mono.NsPerCall*0.5 {
			t.Errorf("syscall %.1f ns < half of vDSO %.1f ns", sc.NsPerCall, mono.NsPerCall)
		}
	}
	h := r.Histogram
	if h.Loops < 1000 || h.Backwards != 0 || h.Under1us <= 0 || h.Under1us > 100 {
		t.Fatalf("histogram %+v", h)
	}
	var sum int64
	for _, b := range h.Buckets {
		sum += b.Count
	}
	if sum != h.Loops {
		t.Errorf("buckets hold %d of %d loops", sum, h.Loops)
	}
	if r.Verdict.Level != "fast" && r.Verdict.Level != "slow" {
		t.Errorf("verdict %+v", r.Verdict)
	}
	if r.Input.VDSONs != mono.NsPerCall {
		t.Errorf("verdict input not from the measurement")
	}
}

func FuzzCPUFlags(f *testing.F) {
	f.Add("flags\t: tsc constant_tsc\n")
	f.Add("flags:\nflags: a")
	f.Fuzz(func(t *testing.T, s string) {
		for k := range CPUFlags(s) {
			if k == "" || strings.ContainsAny(k, " \t\n") {
				t.Fatalf("bad flag %q", k)
			}
		}
	})
}

package clocktime

import (
	"bytes"
	"strings"
	"testing"
)

func TestWriteText(t *testing.T) {
	r := &Report{
		Costs:     []ClockCost{{Name: "monotonic (vDSO, time.Since)", NsPerCall: 21.5}, {Name: "tai (syscall)", Error: "not supported"}},
		Histogram: Histogram{Loops: 1000, NsPerLoop: 22, Under1us: 99.5, Buckets: []Bucket{{BelowNs: 32, Percent: 99.5, Count: 995}}},
		System:    System{Clocksource: "tsc", Available: []string{"tsc", "hpet"}, TSC: true},
		Verdict:   Verdict{Summary: "fine", Meaning: "cheap clocks", Fix: ""},
	}
	var b bytes.Buffer
	r.WriteText(&b)
	out := b.String()
	for _, want := range []string{"21.5 ns", "error: not supported", "1000 loops", "Clocksource: tsc (available: tsc hpet)",
		"Virtual machine: not detected", "Verdict: fine"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Fix:") {
		t.Errorf("a verdict without a fix printed a Fix line:\n%s", out)
	}
}

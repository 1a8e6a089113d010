package bench

import (
	"bufio"
	"bytes"
	"runtime"
	"strings"

	"github.com/udskit/udskit/internal/proc"
)

// System describes the machine a report was measured on.
type System struct {
	Kernel      string `json:"kernel"`
	CPU         string `json:"cpu"`
	Cores       int    `json:"cores"`
	Clocksource string `json:"clocksource"`
	GoVersion   string `json:"go"`
	OS          string `json:"os"`
	Arch        string `json:"arch"`
}

func readTrim(path string) string {
	s, err := proc.ReadSmall(path)
	if err != nil {
		return "unknown"
	}
	return s
}

// CollectSystem reads kernel release, CPU model, core count, clocksource and Go version.
func CollectSystem() System {
	s := System{
		Kernel:      readTrim("/proc/sys/kernel/osrelease"),
		CPU:         "unknown",
		Cores:       runtime.NumCPU(),
		Clocksource: readTrim("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
		GoVersion:   runtime.Version(),
		OS:          runtime.GOOS,
		Arch:        runtime.GOARCH,
	}
	if b, err := proc.ReadSmall("/proc/cpuinfo"); err == nil {
		s.CPU = cpuModel([]byte(b))
	}
	return s
}

// cpuModel finds the CPU model in /proc/cpuinfo text.
func cpuModel(b []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Model", "cpu model", "Processor":
			if v = strings.TrimSpace(v); v != "" {
				return strings.Join(strings.Fields(v), " ")
			}
		}
	}
	return "unknown"
}

package bench

import (
	"bufio"
	"bytes"
	"runtime"
	"strings"
	"time"

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
	// MemcpyGBps is the copy bandwidth of 1 MiB buffers on one thread,
	// measured at the start of the run (MeasureMemcpy).
	MemcpyGBps float64 `json:"memcpy_gbps,omitempty"`
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
	s.MemcpyGBps = MeasureMemcpy(100 * time.Millisecond)
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

// MeasureMemcpy copies 1 MiB between two buffers for about d (bounded to
// 20,000 copies) and returns the best of its 10 slices in GB/s: what
// writing a payload once into shared memory costs at best on this machine.
func MeasureMemcpy(d time.Duration) float64 {
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i)
	}
	best := 0.0
	for slice := 0; slice < 10; slice++ {
		n, start := 0, time.Now()
		for n < 2000 && time.Since(start) < d/10 {
			copy(dst, src)
			n++
		}
		if el := time.Since(start).Seconds(); el > 0 {
			best = max(best, float64(n)*float64(len(src))/el/1e9)
		}
	}
	return best
}

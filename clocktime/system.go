package clocktime

import (
	"os"
	"path/filepath"
	"strings"
)

// maxSysFile caps how much of one /sys or /proc file is read.
const maxSysFile = 4 << 20

func readSmall(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, maxSysFile)
	n, _ := f.Read(b)
	for n < len(b) {
		m, err := f.Read(b[n:])
		n += m
		if err != nil || m == 0 {
			break
		}
	}
	return strings.TrimSpace(string(b[:n]))
}

// vmVendors maps DMI sys_vendor / product_name fragments to hypervisors.
var vmVendors = []string{"QEMU", "KVM", "VMware", "VirtualBox", "innotek", "Xen", "Microsoft Corporation",
	"Amazon EC2", "Google Compute Engine", "Parallels", "BHYVE", "Apple Virtualization", "Firecracker", "OpenStack"}

// ReadSystem reads the clocksource, the CPU's TSC flags and VM evidence.
// Missing files leave fields empty; it never fails.
func ReadSystem(sysRoot, procRoot string) System {
	var s System
	cs := filepath.Join(sysRoot, "devices/system/clocksource/clocksource0")
	s.Clocksource = readSmall(filepath.Join(cs, "current_clocksource"))
	s.Available = strings.Fields(readSmall(filepath.Join(cs, "available_clocksource")))
	flags := CPUFlags(readSmall(filepath.Join(procRoot, "cpuinfo")))
	s.TSC, s.ConstantTSC, s.NonstopTSC = flags["tsc"], flags["constant_tsc"], flags["nonstop_tsc"]
	var ev []string
	if flags["hypervisor"] {
		ev = append(ev, "cpu flag hypervisor")
	}
	for _, f := range []string{"class/dmi/id/sys_vendor", "class/dmi/id/product_name"} {
		v := readSmall(filepath.Join(sysRoot, f))
		for _, known := range vmVendors {
			if v != "" && strings.Contains(strings.ToLower(v), strings.ToLower(known)) {
				ev = append(ev, "DMI "+filepath.Base(f)+" "+v)
				break
			}
		}
	}
	if t := readSmall(filepath.Join(sysRoot, "hypervisor/type")); t != "" {
		ev = append(ev, "hypervisor type "+t)
	}
	s.VM = len(ev) > 0
	s.VMHow = strings.Join(ev, ", ")
	return s
}

// CPUFlags returns the flags of the first "flags" line of /proc/cpuinfo text.
func CPUFlags(cpuinfo string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			out[f] = true
		}
		break
	}
	return out
}

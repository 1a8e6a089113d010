package kcapture

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/proc"
)

const (
	btfPath     = "/sys/kernel/btf/vmlinux"
	tracefsPath = "/sys/kernel/tracing"
)

// Capabilities needed without root (bits of CapEff).
const (
	capDACReadSearch = 2
	capSysAdmin      = 21
	capPerfmon       = 38
	capBPF           = 39
)

// Requirement errors, wrapped with what to do.
var (
	ErrPrivilege = errors.New("kcapture: not privileged")
	ErrNoBTF     = errors.New("kcapture: kernel has no BTF")
	ErrTracefs   = errors.New("kcapture: tracefs not available")
	ErrKernel    = errors.New("kcapture: kernel refused the capture programs")
)

// Report says what this machine supports.
type Report struct {
	// OK is true when kernel capture can run (with syscall tracepoints).
	OK bool
	// Method is the attach point kernel capture uses.
	Method string
	// Fentry is nil when BPF tracing (fentry) programs load, else why not.
	Fentry error
	// Problems, each with its fix; empty when OK.
	Problems []error
	// Notes describe what was checked.
	Notes []string
}

// Check examines privileges, BTF, tracefs and which BPF programs the kernel
// accepts, without attaching anything. If mount is true and tracefs is missing,
// it mounts it (as Open does).
func Check(mount bool) *Report {
	r := &Report{}
	if err := checkPrivilege(); err != nil {
		r.Problems = append(r.Problems, err)
	}
	if _, err := os.Stat(btfPath); err != nil {
		r.Problems = append(r.Problems, fmt.Errorf("%w (%s: %v): kernel capture needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (Linux >= 5.8 with BTF, as most distributions ship)", ErrNoBTF, btfPath, err))
	} else {
		r.Notes = append(r.Notes, "BTF: "+btfPath)
	}
	if len(r.Problems) > 0 {
		return r
	}
	if err := ensureTracefs(mount); err != nil {
		r.Problems = append(r.Problems, err)
	} else {
		r.Notes = append(r.Notes, "tracefs: "+tracefsPath)
	}
	spec, err := loadUdscap()
	if err != nil {
		r.Problems = append(r.Problems, fmt.Errorf("kcapture: embedded BPF object: %w", err))
		return r
	}
	r.Fentry = probeFentry(spec)
	how, err := probeLoad(spec)
	if err != nil {
		r.Problems = append(r.Problems, err)
	}
	r.OK = len(r.Problems) == 0
	if r.OK {
		r.Method = methodName(r.Fentry, how)
	}
	return r
}

// methodName says which attach point is used and why.
func methodName(fentry error, how string) string {
	if fentry == nil {
		return fmt.Sprintf("syscall tracepoints (%s; fentry programs load here too, the data path uses the tracepoints)", how)
	}
	return fmt.Sprintf("%v, using syscall tracepoints (%s)", fentry, how)
}

// checkPrivilege reports whether the process may load and attach BPF
// tracing programs: root, or CAP_BPF + CAP_PERFMON (+ CAP_DAC_READ_SEARCH
// for tracefs), or CAP_SYS_ADMIN.
func checkPrivilege() error {
	if os.Geteuid() == 0 {
		return nil
	}
	eff, err := capEff()
	if err != nil {
		return fmt.Errorf("%w: cannot read capabilities (%v); run as root (sudo udskit capture --kernel ...)", ErrPrivilege, err)
	}
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	if has(capSysAdmin) || (has(capBPF) && has(capPerfmon)) {
		return nil
	}
	return fmt.Errorf("%w: kernel capture needs root or CAP_BPF+CAP_PERFMON (run with sudo, or: sudo setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep $(command -v udskit))", ErrPrivilege)
}

func capEff() (uint64, error) {
	st, err := proc.ReadStatus(0)
	if err != nil {
		return 0, err
	}
	return st.CapEff()
}

// ensureTracefs makes sure the syscall tracepoints are visible, mounting
// tracefs when allowed to and missing.
func ensureTracefs(mount bool) error {
	probe := tracefsPath + "/events/syscalls/sys_enter_write"
	if _, err := os.Stat(probe); err == nil {
		return nil
	}
	if _, err := os.Stat("/sys/kernel/debug/tracing/events/syscalls/sys_enter_write"); err == nil {
		return nil
	}
	fix := fmt.Sprintf("mount it with: mount -t tracefs tracefs %s", tracefsPath)
	if !mount {
		return fmt.Errorf("%w: %s has no syscall events; %s", ErrTracefs, tracefsPath, fix)
	}
	if err := unix.Mount("tracefs", tracefsPath, "tracefs", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: mounting tracefs on %s: %v; %s", ErrTracefs, tracefsPath, err, fix)
	}
	if _, err := os.Stat(probe); err != nil {
		return fmt.Errorf("%w: no syscall tracepoints under %s (kernel built without CONFIG_FTRACE_SYSCALLS?): %v", ErrTracefs, tracefsPath, err)
	}
	return nil
}

// probeFentry loads (and closes) the fentry probe program: nil if BPF
// tracing programs are allowed.
func probeFentry(spec *ebpf.CollectionSpec) error {
	ps := spec.Programs[udscapProgProbeFentry]
	if ps == nil {
		return errors.New("fentry probe missing from the BPF object")
	}
	p, err := ebpf.NewProgram(ps)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return errors.New("fentry refused (EPERM)")
		}
		return fmt.Errorf("fentry unavailable (%v)", firstLine(err))
	}
	p.Close()
	return nil
}

// probeLoad loads (without attaching) the capture programs the way Open
// would, to see that the verifier accepts them on this kernel.
func probeLoad(spec *ebpf.CollectionSpec) (string, error) {
	spec = spec.Copy()
	spec.Maps[udscapMapEvents].MaxEntries = 4096
	for _, a := range attachOrder("") {
		coll, err := loadOnly(spec, a)
		if err == nil {
			coll.Close()
			return a.name, nil
		}
		if a.last {
			return "", kernelRefused(err)
		}
	}
	return "", kernelRefused(errors.New("no attach point"))
}

func kernelRefused(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w: %v (EPERM: needs root or CAP_BPF+CAP_PERFMON, and kernel.unprivileged_bpf_disabled / lockdown must allow BPF tracepoint programs)", ErrKernel, firstLine(err))
	}
	return fmt.Errorf("%w: %v (needs Linux >= 5.17 with BTF, ring buffers and bpf_loop)", ErrKernel, firstLine(err))
}

// firstLine trims verifier logs to their first line.
func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

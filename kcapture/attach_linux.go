package kcapture

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Attach modes (Options.Attach).
const (
	// AttachAuto tries the raw syscall tracepoints, then the per-syscall ones.
	AttachAuto = ""
	// AttachRaw uses raw_tracepoint/sys_enter and sys_exit: two programs
	// that see every syscall and keep the eight that move socket data;
	// cheaper per traced call (no perf buffer). x86-64 only.
	AttachRaw = "raw"
	// AttachTracepoints uses syscalls/sys_enter_* and sys_exit_* of the
	// eight syscalls.
	AttachTracepoints = "tracepoints"
)

// attachPoint is one way of attaching the capture programs.
type attachPoint struct {
	name  string
	progs func(name string) bool // which programs of the object it uses
	last  bool                   // no fallback after it
}

var (
	rawAttach = attachPoint{
		name:  "raw sys_enter/sys_exit",
		progs: func(n string) bool { return n == udscapProgRawEnter || n == udscapProgRawExit },
	}
	tpAttach = attachPoint{
		name:  "syscalls/sys_enter_* and sys_exit_* of write, writev, sendto, sendmsg, read, readv, recvfrom, recvmsg",
		progs: func(n string) bool { return strings.HasPrefix(n, "enter_") || strings.HasPrefix(n, "exit_") },
		last:  true,
	}
)

// attachOrder lists the attach points to try for mode.
func attachOrder(mode string) []attachPoint {
	raw := runtime.GOARCH == "amd64"
	switch {
	case mode == AttachTracepoints || !raw:
		return []attachPoint{tpAttach}
	case mode == AttachRaw:
		r := rawAttach
		r.last = true
		return []attachPoint{r}
	}
	return []attachPoint{rawAttach, tpAttach}
}

// loadOnly loads the maps and a's programs of spec.
func loadOnly(spec *ebpf.CollectionSpec, a attachPoint) (*ebpf.Collection, error) {
	spec = spec.Copy()
	for name := range spec.Programs {
		if !a.progs(name) {
			delete(spec.Programs, name)
		}
	}
	if err := setSyscallNumbers(spec); err != nil {
		return nil, err
	}
	return ebpf.NewCollection(spec)
}

// setSyscallNumbers gives the raw programs this architecture's numbers.
func setSyscallNumbers(spec *ebpf.CollectionSpec) error {
	nrs := map[string]int64{
		udscapVarNrWrite: unix.SYS_WRITE, udscapVarNrWritev: unix.SYS_WRITEV,
		udscapVarNrSendto: unix.SYS_SENDTO, udscapVarNrSendmsg: unix.SYS_SENDMSG,
		udscapVarNrRead: unix.SYS_READ, udscapVarNrReadv: unix.SYS_READV,
		udscapVarNrRecvfrom: unix.SYS_RECVFROM, udscapVarNrRecvmsg: unix.SYS_RECVMSG,
	}
	for name, nr := range nrs {
		if err := spec.Variables[name].Set(nr); err != nil {
			return fmt.Errorf("kcapture: setting %s: %w", name, err)
		}
	}
	return nil
}

// loadAndAttach loads and attaches the programs with the first attach point
// of mode the kernel accepts, and says which.
func (c *Capture) loadAndAttach(spec *ebpf.CollectionSpec, mode string) (string, error) {
	var errs []string
	for _, a := range attachOrder(mode) {
		err := c.tryAttach(spec, a)
		if err == nil {
			if len(errs) > 0 {
				return a.name + "; " + strings.Join(errs, "; "), nil
			}
			return a.name, nil
		}
		c.Close()
		if a.last {
			return "", err
		}
		errs = append(errs, fmt.Sprintf("%s refused: %v", a.name, firstLine(err)))
	}
	return "", fmt.Errorf("%w: no attach point", ErrKernel)
}

func (c *Capture) tryAttach(spec *ebpf.CollectionSpec, a attachPoint) error {
	coll, err := loadOnly(spec, a)
	if err != nil {
		return kernelRefused(err)
	}
	c.coll = coll
	c.attached = nil
	for _, name := range attachSequence(coll.Programs) {
		prog := coll.Programs[name]
		var l link.Link
		if a.name == rawAttach.name {
			tp := strings.Replace(name, "raw_", "sys_", 1)
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: prog})
			if err != nil {
				return fmt.Errorf("kcapture: attaching raw tracepoint %s: %w", tp, err)
			}
		} else {
			dir, call, _ := strings.Cut(name, "_")
			tp := "sys_" + dir + "_" + call
			l, err = link.Tracepoint("syscalls", tp, prog, nil)
			if err != nil {
				return fmt.Errorf("kcapture: attaching to syscalls/%s: %w", tp, err)
			}
		}
		c.links = append(c.links, l)
		c.attached = append(c.attached, name)
	}
	return nil
}

// attachSequence orders the programs to attach: every exit program before
// any enter program, each group by name. A syscall whose entry is recorded
// (a pending entry for its thread) must have its exit seen: with an enter
// program attached first, a syscall entering in between left an entry no
// exit consumed (the kernel then also discards it, see pending_of in
// bpf/udscap.c). Capture.detach closes them in reverse: the enters first,
// so a syscall whose entry was seen still has its exit recorded.
func attachSequence[P any](progs map[string]P) []string {
	names := make([]string, 0, len(progs))
	for name := range progs {
		names = append(names, name)
	}
	isExit := func(n string) bool { return strings.HasPrefix(n, "exit_") || n == udscapProgRawExit }
	slices.SortFunc(names, func(a, b string) int {
		if ea, eb := isExit(a), isExit(b); ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

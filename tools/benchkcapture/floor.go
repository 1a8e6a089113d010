//go:build linux

package main

import (
	"errors"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// attachEmpty attaches BPF programs that do nothing ("return 0") to the raw
// sys_enter and sys_exit tracepoints, the attach points kernel capture uses
// on x86-64. Any capture built on syscall tracepoints pays at least this:
// once a syscall tracepoint is enabled, every syscall of every process takes
// the kernel's traced entry and exit path and runs the program. The mode that
// uses it shows how much of the capture's cost is that floor.
func attachEmpty() (stop func(), err error) {
	var closers []func() error
	stop = func() {
		for _, c := range closers {
			_ = c()
		}
	}
	for _, tp := range []string{"sys_enter", "sys_exit"} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.RawTracepoint,
			License:      "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		})
		if err != nil {
			stop()
			return nil, errors.Join(errors.New("loading an empty raw tracepoint program"), err)
		}
		closers = append(closers, prog.Close)
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: prog})
		if err != nil {
			stop()
			return nil, errors.Join(errors.New("attaching an empty program to "+tp), err)
		}
		closers = append([]func() error{l.Close}, closers...)
	}
	return stop, nil
}

// Package kcapture records the traffic of unix domain sockets from the kernel
// with eBPF: the bytes every selected process sends and receives, including on
// connections opened before the capture began, with no restart and no
// interposition.
//
// How: BPF programs on the syscalls write, writev, sendto, sendmsg, read,
// readv, recvfrom and recvmsg (raw sys_enter/sys_exit tracepoints on x86-64,
// else the per-syscall tracepoints; see attach_linux.go) look the fd up in
// the calling task's fd table and keep only AF_UNIX sockets the Selection
// picks (all, one process, or the sockets bound to a path and their peers),
// then copy up to Snaplen bytes of each call into a ring buffer in chunks (see
// bpf/udscap.c). User space reads the ring in place from its mapping
// (ring_linux.go: no copy out; a message of one record is written out from
// the ring itself), reassembles the chunks into messages (Assembler),
// pairs both ends of each connection by their kernel socket identity and
// writes every connection to a record.Sink (Tracker): the outputs every
// capture mode shares (pcapng, each connection one synthetic TCP flow, or the
// live text view). Nothing is dropped silently: ring-buffer overruns, unreadable user
// memory and program recursion misses are counted (Stats) and marked in the
// output.
//
// The BPF object is generated with bpf2go and committed (see gen.go): building
// needs no clang and no kernel headers; CO-RE relocations adapt it to the
// running kernel's BTF at load time. fentry programs on the unix socket
// functions would see the data without a syscall filter; Check and Open try
// to load one first and report the kernel's answer (often EPERM under
// lockdown or in sandboxes); the data path uses the syscall tracepoints.
//
// Kernel capture needs Linux, BTF (/sys/kernel/btf/vmlinux), root (or
// CAP_BPF+CAP_PERFMON+CAP_DAC_READ_SEARCH) and tracefs (mounted by Open when
// missing and permitted).
//
// May import: record, socklist, uds, internal packages; never capture.
package kcapture

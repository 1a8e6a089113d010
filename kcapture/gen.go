package kcapture

// The BPF objects and their Go bindings (udscap_bpfel.*, and udscap_bpfeb.*
// for big-endian machines) are generated and committed, so building udskit
// needs no clang and no kernel headers. After changing bpf/*.c or bpf/*.h,
// regenerate with
//
//	go generate ./kcapture
//
// which needs clang, llvm-strip and the libbpf headers (Debian: apt-get
// install clang llvm libbpf-dev). The kernel structures are declared in
// bpf/kernel_types.h with CO-RE relocations, so no vmlinux.h is needed.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -target bpfel,bpfeb -type event udscap bpf/udscap.c -- -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu -O2 -g -Wall

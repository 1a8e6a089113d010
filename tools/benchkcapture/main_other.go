//go:build !linux

// Command kcapture measures kernel capture's overhead; it needs Linux.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench/kcapture: kernel capture needs Linux (eBPF)")
	os.Exit(1)
}

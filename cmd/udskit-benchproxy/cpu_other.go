//go:build !linux

package main

import "time"

// procCPU is not measured off Linux (no /proc).
func procCPU(int) (time.Duration, bool) { return 0, false }

// selfCPU is not measured off Linux.
func selfCPU() time.Duration { return 0 }

// treeCPU is not measured off Linux.
func treeCPU(int) (time.Duration, bool) { return 0, false }

//go:build !linux

package uds

import "syscall"

// sshProcAttr: without Pdeathsig, a forwarder outlives a killed parent
// until its connection ends.
func sshProcAttr() *syscall.SysProcAttr { return nil }

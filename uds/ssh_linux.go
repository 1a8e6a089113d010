package uds

import "syscall"

// sshProcAttr makes the kernel end an ssh forwarder whose parent dies.
func sshProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} }

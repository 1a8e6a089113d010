//go:build !linux

package testsvc

import "os/exec"

func setPdeathsig(cmd *exec.Cmd) {}

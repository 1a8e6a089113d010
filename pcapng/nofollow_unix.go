//go:build unix

package pcapng

import "syscall"

const oNoFollow = syscall.O_NOFOLLOW

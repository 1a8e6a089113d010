//go:build unix

package capture

import "syscall"

const oNoFollow = syscall.O_NOFOLLOW

package rpc

import "syscall"

// errTooManyFiles is a temporary accept failure (EMFILE) worth retrying.
var errTooManyFiles error = syscall.EMFILE

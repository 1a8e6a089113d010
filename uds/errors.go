package uds

import (
	"errors"
	"fmt"
)

// PathTooLongError reports a socket path longer than the OS allows in sun_path.
type PathTooLongError struct {
	Path string
	Len  int // bytes in Path
	Max  int // the OS limit, including the terminating NUL (108 Linux, 104 macOS)
}

func (e *PathTooLongError) Error() string {
	return fmt.Sprintf("socket path is %d bytes, over the OS limit of %d (sun_path): %q; "+
		"use a shorter or relative path (chdir first), or an abstract name (@name, Linux)",
		e.Len, e.Max-1, e.Path)
}

// NotSocketError reports a path that exists but is not a socket. Listen never
// removes such a path.
type NotSocketError struct {
	Path string
	What string // "regular file", "directory", ...
}

func (e *NotSocketError) Error() string {
	return fmt.Sprintf("%s exists and is a %s, not a socket; refusing to remove it", e.Path, e.What)
}

// InUseError reports a socket path on which a live server answers.
type InUseError struct {
	Path string
	PID  int // 0 when the OS cannot tell
}

func (e *InUseError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is in use by a live server (pid %d)", e.Path, e.PID)
	}
	return fmt.Sprintf("%s is in use by a live server", e.Path)
}

// ErrInUse matches any *InUseError with errors.Is.
var ErrInUse = errors.New("socket in use by a live server")

func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// DialError explains a failed Dial in words; Unwrap keeps the errno
// (syscall.ENOENT, ECONNREFUSED, EACCES, ...) for errors.Is.
type DialError struct {
	Addr  Addr
	Cause string // a sentence for people
	Err   error
}

func (e *DialError) Error() string { return fmt.Sprintf("dial %s: %s: %v", e.Addr, e.Cause, e.Err) }
func (e *DialError) Unwrap() error { return e.Err }

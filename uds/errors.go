package uds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// PathTooLongError reports a socket path (or abstract name) longer than the OS
// allows in sockaddr_un.sun_path. It is returned before any system call is made.
type PathTooLongError struct {
	Path string
	Len  int // bytes in Path ("@name" for abstract names)
	Max  int // size of sun_path, including the terminating NUL (108 Linux, 104 macOS)
}

func (e *PathTooLongError) Error() string {
	if len(e.Path) > 0 && e.Path[0] == '@' {
		return fmt.Sprintf("abstract socket name %q is %d bytes, over the OS limit of %d (sun_path is %d bytes); "+
			"use a shorter name", e.Path, e.Len, e.Max, e.Max)
	}
	return fmt.Sprintf("socket path %q is %d bytes, over the OS limit of %d (sun_path is %d bytes including the "+
		"terminating NUL); use a shorter path, a relative path (chdir to the directory first), or an abstract name (@name, Linux only)",
		e.Path, e.Len, e.Max-1, e.Max)
}

// NotSocketError reports a path that exists but is not a socket. Listen never
// removes such a path; Dial reports it instead of a bare ECONNREFUSED.
type NotSocketError struct {
	Path string
	What string // "regular file", "directory", "symbolic link", ...
}

func (e *NotSocketError) Error() string {
	return fmt.Sprintf("%s is a %s, not a socket", e.Path, e.What)
}

// InUseError reports a socket on which a live server answers.
type InUseError struct {
	Path string // the path, or "@name" for an abstract name
	PID  int    // the server's pid as the kernel reports it; 0 when the OS cannot tell
}

func (e *InUseError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is in use by a live server (pid %d)", e.Path, e.PID)
	}
	return fmt.Sprintf("%s is in use by a live server", e.Path)
}

// ErrInUse matches any *InUseError with errors.Is.
var ErrInUse = errors.New("socket in use by a live server")

// Is makes errors.Is(err, ErrInUse) true for an *InUseError.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// ErrPolicyOnTCP is returned by Listen when a Policy is set on a TCP address:
// TCP peers carry no kernel credentials, so the policy could not be enforced.
var ErrPolicyOnTCP = errors.New("a peer-credential Policy cannot be enforced on TCP (no kernel credentials); use a unix socket")

// DialError explains a failed Dial in words. Unwrap keeps the underlying error
// (a syscall.Errno such as ENOENT, ECONNREFUSED or EACCES, a *PathTooLongError,
// a *NotSocketError, or a context error) for errors.Is and errors.As.
type DialError struct {
	Addr  Addr
	Cause string // a sentence for people
	Err   error
}

// Error says the cause once: the underlying error is added in parentheses
// only when it tells something the cause does not (a *NotSocketError is the
// cause itself; "connection refused: ..." already names ECONNREFUSED).
func (e *DialError) Error() string {
	msg := fmt.Sprintf("dial %s: %s", e.Addr, e.Cause)
	var nse *NotSocketError
	var tl *PathTooLongError
	if e.Err == nil || errors.As(e.Err, &nse) || errors.As(e.Err, &tl) {
		return msg
	}
	detail := e.Err.Error()
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		detail = errno.Error() // not the context error or wrapping around it
	} else if errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, context.DeadlineExceeded) {
		return msg // "canceled", "timed out" or "gave up ..." says it
	}
	if strings.Contains(e.Cause, detail) {
		return msg
	}
	return msg + " (" + detail + ")"
}

// Unwrap returns the underlying error.
func (e *DialError) Unwrap() error { return e.Err }

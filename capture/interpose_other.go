//go:build !linux

package capture

import (
	"context"
	"errors"
)

// ErrUnsupported: interposing needs Linux (hard links of sockets, SO_PEERCRED,
// per-thread credentials).
var errInterposeUnsupported = errors.New("capture: interposing on a socket path is supported on Linux only; use udskit proxy --capture")

// Interposer is Linux-only.
type Interposer struct{}

// Interpose is Linux-only.
func Interpose(context.Context, string, InterposeOptions) (*Interposer, error) {
	return nil, errInterposeUnsupported
}

// Serve is Linux-only.
func (*Interposer) Serve(context.Context) error { return errInterposeUnsupported }

// Shutdown is Linux-only.
func (*Interposer) Shutdown(context.Context) error { return errInterposeUnsupported }

// Cut is Linux-only.
func (*Interposer) Cut() {}

// Stats is Linux-only.
func (*Interposer) Stats() Stats { return Stats{} }

// Path is Linux-only.
func (*Interposer) Path() string { return "" }

// Restore is Linux-only.
func Restore(string) (string, error) { return "", errInterposeUnsupported }

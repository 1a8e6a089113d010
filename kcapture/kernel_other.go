//go:build !linux

package kcapture

import (
	"context"
	"errors"
)

// ErrUnsupported is returned on systems other than Linux.
var ErrUnsupported = errors.New("kernel capture needs Linux (eBPF)")

// Report says what this machine supports.
type Report struct {
	OK       bool
	Method   string
	Fentry   error
	Problems []error
	Notes    []string
}

// Check reports that kernel capture needs Linux.
func Check(mount bool) *Report { return &Report{Problems: []error{ErrUnsupported}} }

// Capture is unavailable on this system.
type Capture struct{}

// Open returns ErrUnsupported.
func Open(opts Options) (*Capture, error) { return nil, ErrUnsupported }

// Method is empty.
func (c *Capture) Method() string { return "" }

// Run returns ErrUnsupported.
func (c *Capture) Run(ctx context.Context, sink Sink, resolve Resolver) (*Stats, error) {
	return nil, ErrUnsupported
}

// Close does nothing.
func (c *Capture) Close() error { return nil }

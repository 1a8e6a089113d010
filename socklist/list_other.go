//go:build !linux

package socklist

import "context"

// List returns ErrUnsupported outside Linux.
func List(ctx context.Context, opts Options) (*Snapshot, error) { return nil, ErrUnsupported }

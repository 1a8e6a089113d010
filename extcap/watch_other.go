//go:build !linux

package extcap

import (
	"context"
	"os"
)

// watchReader is Linux-only; elsewhere the first failed write ends the
// capture.
func watchReader(context.Context, *os.File, func()) {}

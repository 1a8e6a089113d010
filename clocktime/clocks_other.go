//go:build !linux

package clocktime

type sysClock struct {
	name string
	read func() error
}

// syscallClocks is empty outside Linux: only the vDSO-path rows are measured.
func syscallClocks() []sysClock { return nil }

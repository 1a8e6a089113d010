//go:build !unix

package capture

const oNoFollow = 0

//go:build !unix

package pcapng

const oNoFollow = 0

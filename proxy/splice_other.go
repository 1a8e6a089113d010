//go:build !linux

package proxy

import "net"

// canSplice is false off Linux: there is no splice(2).
func canSplice(net.Conn) bool { return false }

func spliceCopy(dst, src net.Conn, _ int, _ bool, act *activity) (int64, error) {
	return bufferCopy(dst, src, act)
}

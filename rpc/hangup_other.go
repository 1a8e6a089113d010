//go:build !linux

package rpc

import (
	"net"
	"time"
)

// peerHungUp cannot tell a closed peer from a half-closed one here: it waits
// d and reports false. A write to a gone peer still fails the connection.
func peerHungUp(_ net.Conn, d time.Duration) bool {
	time.Sleep(d)
	return false
}

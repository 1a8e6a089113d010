package rpc

import (
	"net"

	"github.com/udskit/udskit/uds"
)

// setSocketBuffer applies ServerOptions/ClientOptions.SocketBuffer to c:
// 0 means uds.DefaultSocketBuffer, negative keeps the kernel's default.
func setSocketBuffer(c net.Conn, size int) {
	if size < 0 {
		return
	}
	if size == 0 {
		size = uds.DefaultSocketBuffer
	}
	_ = uds.SetSendBuffer(c, size) // best effort: the default still works
}

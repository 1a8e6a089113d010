package rpc

import (
	"net"

	"github.com/udskit/udskit/uds"
)

// DefaultSocketBuffer is the SO_SNDBUF given to unix-socket connections when the
// options leave SocketBuffer at 0. Unix stream sockets do not autotune their
// buffers as TCP does, and the sender's SO_SNDBUF bounds the bytes in flight;
// the kernel default (about 208 KiB) is less than two 100 KiB calls, so one
// multiplexed connection carrying many large calls stalls on every write.
// Measured side by side (docs/performance.md): 16 callers at 100 KiB went from
// about 0.4x to 0.65x of 16 raw unix connections.
const DefaultSocketBuffer = 4 << 20

// setSocketBuffer applies ServerOptions/ClientOptions.SocketBuffer to c:
// 0 means DefaultSocketBuffer, negative keeps the kernel's default.
func setSocketBuffer(c net.Conn, size int) {
	if size < 0 {
		return
	}
	if size == 0 {
		size = DefaultSocketBuffer
	}
	_ = uds.SetSendBuffer(c, size) // best effort: the default still works
}

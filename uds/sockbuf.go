package uds

import "net"

// DefaultSocketBuffer is the SO_SNDBUF udskit gives unix-socket connections
// (rpc clients and servers, proxy) when their options leave SocketBuffer at 0.
// Unix stream sockets do not autotune their buffers as TCP does, and the
// sender's SO_SNDBUF bounds the bytes in flight; the kernel default (about
// 208 KiB) is less than two 100 KiB calls, so one multiplexed connection
// carrying many large calls stalls on every write, and a proxy is woken every
// ~200 KB of a bulk transfer. The kernel caps it at net.core.wmem_max.
// Measured side by side (docs/performance.md): 16 rpc callers at 100 KiB went
// from about 0.4x to 0.65x of 16 raw unix connections.
const DefaultSocketBuffer = 4 << 20

// SetSendBuffer sets SO_SNDBUF on a unix socket connection (a *Conn from a
// Listener, or a *net.UnixConn from Dial) and does nothing for other conns:
// TCP autotunes its buffers, unix stream sockets do not, and on a unix socket
// the sender's SO_SNDBUF bounds the bytes in flight. The kernel caps size at
// net.core.wmem_max and reports back twice the value set. Memory is charged
// only as it is used, so a large value costs nothing on an idle connection.
func SetSendBuffer(c net.Conn, size int) error {
	if uc, ok := c.(*Conn); ok {
		c = uc.NetConn()
	}
	if u, ok := c.(*net.UnixConn); ok {
		return u.SetWriteBuffer(size)
	}
	return nil
}

package uds

import "net"

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

//go:build !linux

package capture

func (c *relayConn) readMsg(b []byte) (int, string, error) {
	n, err := c.Conn.Read(b)
	return n, "", err
}

func (c *relayConn) writeMsg(b, _ []byte) (int, error) { return c.Conn.Write(b) }

func closeRights([]byte) {}

package capture

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/udskit/udskit/uds"
)

// ServerWrap returns a conn wrapper for connections this process accepted
// (rpc.ServerOptions.WrapConn): each records its own traffic into sink,
// reads as client->server, writes as server->client, with udskit frames
// decoded into comments. socket names the capture interface.
func ServerWrap(sink Sink, socket string) func(net.Conn) net.Conn {
	return func(c net.Conn) net.Conn { return WrapConn(c, sink, socket, true) }
}

// ClientWrap is ServerWrap for connections this process dialed
// (rpc.ClientOptions.WrapConn, or any uds.Dial conn).
func ClientWrap(sink Sink, socket string) func(net.Conn) net.Conn {
	return func(c net.Conn) net.Conn { return WrapConn(c, sink, socket, false) }
}

// self is this process as a Peer.
func self() Peer {
	return Peer{Known: true, Cred: uds.Cred{PID: int32(os.Getpid()), UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}, Comm: comm(int32(os.Getpid()))}
}

// WrapConn records c's traffic into sink: what this process reads and
// writes. server says whether this process accepted c (else it dialed it).
// The returned conn forwards CloseWrite and CloseRead; it has no NetConn
// method, so code that would bypass it for the raw socket cannot.
func WrapConn(c net.Conn, sink Sink, socket string, server bool) net.Conn {
	ci := ConnInfo{Socket: socket, Start: time.Now(), Note: "recorded by the process itself"}
	sc := &selfConn{Conn: c, readDir: ServerToClient}
	if server {
		ci.Client, ci.Server = PeerOf(c), self()
		sc.readDir = ClientToServer
	} else {
		ci.Client, ci.Server = self(), PeerOf(c)
	}
	sc.rec = sink.Open(ci)
	return sc
}

// selfConn records both directions of a conn this process uses. Each
// direction has its own annotator and lock: reads are made by one reader
// at a time and writes by one writer at a time, but the two overlap.
type selfConn struct {
	net.Conn
	rec       Recording
	readDir   Dir
	rmu, wmu  sync.Mutex
	ann       [2]Annotator // by Dir
	closeOnce sync.Once
}

func (c *selfConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.rmu.Lock()
	now := time.Now()
	if n > 0 {
		c.rec.Data(c.readDir, now, b[:n], c.ann[c.readDir].Feed(b[:n]))
	}
	if err == io.EOF {
		c.rec.End(c.readDir, now)
	}
	c.rmu.Unlock()
	return n, err
}

func (c *selfConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	wd := c.readDir ^ 1
	c.wmu.Lock()
	if n > 0 {
		c.rec.Data(wd, time.Now(), b[:n], c.ann[wd].Feed(b[:n]))
	}
	c.wmu.Unlock()
	return n, err
}

// CloseWrite half-closes and records the end of this side's data.
func (c *selfConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.ErrUnsupported
	}
	err := cw.CloseWrite()
	c.rec.End(c.readDir^1, time.Now())
	return err
}

// CloseRead forwards to the socket.
func (c *selfConn) CloseRead() error {
	if cr, ok := c.Conn.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return errors.ErrUnsupported
}

func (c *selfConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { c.rec.Close(false, time.Now()) })
	return err
}

// WrapListener records every conn l accepts (for servers that take a
// net.Listener, such as rpc.Server.Serve).
func WrapListener(l net.Listener, sink Sink, socket string) net.Listener {
	return &wrapListener{Listener: l, wrap: ServerWrap(sink, socket)}
}

type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l *wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(c), nil
}

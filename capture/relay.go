package capture

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/udskit/udskit/uds"
)

// relayPair joins the two sides of a relayed connection for recording: the
// bytes read from each side are recorded in its direction, and file
// descriptors passed with SCM_RIGHTS are forwarded to the other side (unix
// sockets on Linux) and noted.
//
// pending[d] holds control data read in direction d and not yet written:
// it is set by a Read on the source conn and taken by the next Write on the
// destination conn. Both happen on the one goroutine that copies direction
// d (proxy.Join's copy loop), so no lock is needed for it.
type relayPair struct {
	rec     Recording
	side    [2]net.Conn // by Dir: the conn that direction's bytes are read from
	pending [2][]byte
	mu      sync.Mutex
	reset   bool // a side was reset (ECONNRESET/EPIPE)
}

// relayConn is one side of a relayPair. It deliberately has no NetConn
// method, so proxy.Join cannot unwrap it and splice past the recording.
type relayConn struct {
	net.Conn
	pair *relayPair
	dir  Dir // direction of the bytes read from this conn
	oob  []byte
}

// wrapRelay wraps client and server for recording into rec. It gives the
// unix sockets among them uds.DefaultSocketBuffer first: proxy.Join cannot
// reach the socket under a relayConn to do it.
func wrapRelay(client, server net.Conn, rec Recording) (net.Conn, net.Conn, *relayPair) {
	_ = uds.SetSendBuffer(client, uds.DefaultSocketBuffer)
	_ = uds.SetSendBuffer(server, uds.DefaultSocketBuffer)
	p := &relayPair{rec: rec, side: [2]net.Conn{client, server}}
	return &relayConn{Conn: client, pair: p, dir: ClientToServer}, &relayConn{Conn: server, pair: p, dir: ServerToClient}, p
}

func (c *relayConn) Read(b []byte) (int, error) {
	n, note, err := c.readMsg(b)
	if err != nil && errors.Is(err, io.EOF) {
		err = io.EOF // ReadMsgUnix wraps it; copy loops compare with ==
	}
	now := time.Now()
	if n > 0 || note != "" {
		c.pair.rec.Data(c.dir, now, b[:n], note)
	}
	switch {
	case err == io.EOF:
		c.pair.rec.End(c.dir, now)
	case err != nil && isReset(err):
		c.pair.markReset()
	}
	return n, err
}

func (c *relayConn) Write(b []byte) (int, error) {
	other := c.dir ^ 1 // the bytes written here were read in the other direction
	if oob := c.pair.pending[other]; oob != nil {
		c.pair.pending[other] = nil
		n, err := c.writeMsg(b, oob)
		if err != nil || n == len(b) {
			return n, err
		}
		m, err := c.Conn.Write(b[n:])
		return n + m, err
	}
	n, err := c.Conn.Write(b)
	if err != nil && isReset(err) {
		c.pair.markReset()
	}
	return n, err
}

// CloseWrite forwards a half-close.
func (c *relayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (p *relayPair) markReset() {
	p.mu.Lock()
	p.reset = true
	p.mu.Unlock()
}

func (p *relayPair) wasReset() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reset
}

// finish closes the recording: reset when a side was reset or the relay
// ended with an error.
func (p *relayPair) finish(err error) {
	for d := range p.pending {
		closeRights(p.pending[d])
		p.pending[d] = nil
	}
	p.rec.Close(err != nil || p.wasReset(), time.Now())
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// unixConn returns the *net.UnixConn under c (unwrapping *uds.Conn and
// similar), or nil.
func unixConn(c net.Conn) *net.UnixConn {
	for range 8 {
		if uc, ok := c.(*net.UnixConn); ok {
			return uc
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = w.NetConn()
	}
	return nil
}

package rpc

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/internal/shm"
	"github.com/udskit/udskit/internal/spinread"
	"github.com/udskit/udskit/uds"
)

func (c *Client) dialOnce(ctx context.Context, wait bool) (*clientConn, error) {
	conn, err := uds.Dial(ctx, c.addr, uds.DialOptions{Wait: wait, MinBackoff: c.opts.MinBackoff, MaxBackoff: c.opts.MaxBackoff,
		TLS: c.opts.TLS, SSH: c.opts.SSH})
	if err != nil {
		return nil, err
	}
	setSocketBuffer(conn, c.opts.SocketBuffer)
	var uc *net.UnixConn // shared memory: a local unix socket, not wrapped
	if a, err := uds.ParseAddr(c.addr); err == nil && a.IsUnix() && !c.opts.NoShm && c.opts.WrapConn == nil {
		uc = shmCapable(conn)
	}
	if c.opts.WrapConn != nil {
		conn = c.opts.WrapConn(conn)
	}
	cc, err := c.handshakeShm(ctx, conn, uc)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return cc, nil
}

// handshake exchanges hellos on conn and starts the connection's reader.
func (c *Client) handshake(ctx context.Context, conn net.Conn) (*clientConn, error) {
	return c.handshakeShm(ctx, conn, nil)
}

// handshakeShm is handshake that also offers shared memory on uc (conn
// itself), when uc is not nil (protocol/spec.md, section 10).
func (c *Client) handshakeShm(ctx context.Context, conn net.Conn, uc *net.UnixConn) (*clientConn, error) {
	dl := time.Now().Add(c.opts.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	conn.SetDeadline(dl)
	var hb [frame.HelloSize]byte
	mine := frame.Hello{Version: frame.Version, Flags: frame.FeatureStreamCredit | frame.FeatureClientStream, MaxFrame: c.opts.MaxFrame}
	region, shmFD := c.prepareShm(uc)
	if region != nil {
		mine.Flags |= shm.FeatureShm
		if c.opts.ShmCalls {
			mine.Flags |= shm.FeatureShmCalls
			if !c.opts.noCallsBell {
				mine.Flags |= shm.FeatureShmCallsBell
				if !c.opts.noShmStreams {
					mine.Flags |= shm.FeatureShmStreams
				}
			}
		}
		defer func() {
			shm.CloseFD(shmFD) // sent (or not): the mappings keep the region
			if region != nil {
				region.Close() // not in use on this connection
			}
		}()
	}
	mine.Put(hb[:])
	if _, err := conn.Write(hb[:]); err != nil {
		if cause, ok := uds.ExplainTLS(err); ok {
			return nil, &HandshakeError{Addr: c.addr, Cause: cause, Err: err}
		}
		if isClosedErr(err) {
			return nil, &HandshakeError{Addr: c.addr, Closed: true, Err: err}
		}
		return nil, &HandshakeError{Addr: c.addr, Err: fmt.Errorf("send hello: %w", err)}
	}
	// The lone waiter's poll (ClientOptions.NoSpin) reads through spin; cc,
	// made below, is its lone check's.
	var spin *spinread.Reader
	var cc *clientConn
	var rd io.Reader = conn
	if !c.opts.NoSpin {
		spin = spinread.New(conn, LoneSpin, func() bool { return cc.inflight.Load() == 1 })
		if spin.CanPoll() {
			rd = spin
		} else {
			spin = nil
		}
	}
	r := frame.NewReader(rd, 64<<10)
	got, err := r.Peek(frame.HelloSize)
	first := string(got) // what the server sent first, for the errors below
	if len(got) == frame.HelloSize && got[0] == byte(frame.TypeError) {
		return nil, readRefusal(c.addr, r, got)
	} else if err != nil {
		if uds.LooksLikeTLS(got) {
			return nil, &HandshakeError{Addr: c.addr, Cause: "the server speaks TLS: dial it as tls:HOST:PORT (with the CA bundle, --tls-ca)", Err: err}
		}
		if cause, ok := uds.ExplainTLS(err); ok {
			// TLS 1.3: a server refuses a client certificate after the
			// client's handshake is done, so the refusal arrives here.
			return nil, &HandshakeError{Addr: c.addr, Cause: cause, Err: err}
		}
		switch {
		case len(got) == 0 && isClosedErr(err):
			return nil, &HandshakeError{Addr: c.addr, Closed: true, Err: err}
		case len(got) > 0:
			if _, perr := frame.ParseHello(got); perr != nil {
				return nil, &HandshakeError{Addr: c.addr, Err: fmt.Errorf("it answered %q: %w", got, perr)}
			}
		}
		return nil, &HandshakeError{Addr: c.addr, Err: fmt.Errorf("read server hello: %w", err)}
	}
	theirs, err := r.ReadHello()
	if err != nil {
		if rest, _ := r.Peek(min(r.Buffered(), 24)); len(rest) > 0 {
			first += string(rest)
		}
		return nil, &HandshakeError{Addr: c.addr, Err: fmt.Errorf("it answered %q: %w", first, err)}
	}
	_, maxFrame, maxInFlight, err := frame.Negotiate(mine, theirs)
	if err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	var cs *connShm
	if region != nil && theirs.Flags&shm.FeatureShm != 0 {
		cs, err = clientOfferShm(uc, r, region, shmFD, maxFrame, c.opts.ShmThreshold)
		if err != nil {
			return nil, &HandshakeError{Addr: c.addr, Err: err}
		}
		if cs != nil {
			region = nil // the connection owns it now
		}
	}
	conn.SetDeadline(time.Time{})
	if maxInFlight == 0 {
		maxInFlight = frame.DefaultMaxInFlight
	}
	cc = &clientConn{
		onExit: c.connExited, nc: conn, r: r, w: frame.NewWriter(conn), spin: spin,
		maxFrame:      maxFrame,
		clientStreams: theirs.Flags&frame.FeatureClientStream != 0,
		maxInFlight:   int32(min(maxInFlight, 1<<30)),
		semFree:       make(chan struct{}, 1),
		calls:         map[uint32]*call{},
		done:          make(chan struct{}),
		bgWake:        make(chan struct{}, 1),
		shm:           cs,
	}
	if cs != nil {
		cc.startReleaseTimer()
		if mine.Flags&theirs.Flags&shm.FeatureShmCalls != 0 && shm.CheckCalls(cs.region.Size()) {
			cc.slotCalls = newClientCalls(cc, mine.Flags&theirs.Flags&shm.FeatureShmCallsBell != 0, shm.StreamsInUse(mine.Flags, theirs.Flags))
		}
	}
	r.MaxFrame = maxFrame
	if _, ok := conn.(*tls.Conn); ok {
		// A write is a TLS record and a syscall: while other calls are in
		// flight (their callers about to send), gather their requests into it.
		cc.w.Gather = func() bool { return cc.inflight.Load() > 1 }
	}
	c.mu.Lock()
	c.live[cc] = struct{}{}
	c.mu.Unlock()
	c.conns.Add(1)
	go cc.readLoop()
	return cc, nil
}

// connExited forgets a connection whose background reader has ended.
func (c *Client) connExited(cc *clientConn) {
	c.mu.Lock()
	delete(c.live, cc)
	c.mu.Unlock()
	c.conns.Done()
}

// readRefusal reads the error frame a server sent in place of its hello
// (spec 5.4): hdr is its header, already peeked.
func readRefusal(addr string, r *frame.Reader, hdr []byte) error {
	h := frame.ParseHeader(hdr)
	if h.ID != 0 || h.HeadLen > frame.MaxHead || h.Aux == 0 {
		return &HandshakeError{Addr: addr, Err: fmt.Errorf("the server answered with a malformed error frame instead of its hello")}
	}
	b := make([]byte, frame.HelloSize+int(h.HeadLen))
	n, err := io.ReadFull(r.BufReader(), b)
	msg := string(b[min(n, frame.HelloSize):n])
	if err != nil && n < frame.HelloSize {
		return &HandshakeError{Addr: addr, Err: err}
	}
	return &RefusedError{Addr: addr, Err: &Error{Code: Code(h.Aux), Message: msg}}
}

// prepareShm creates the region to offer on uc, or returns nil (no uc, or
// the system refused: the connection then keeps to the socket).
func (c *Client) prepareShm(uc *net.UnixConn) (*shm.Region, int) {
	if uc == nil {
		return nil, -1
	}
	region, fd, err := shm.Create(shm.DefaultRegion)
	if err != nil {
		c.log.Debug("rpc: no shared memory for this connection", "err", err)
		return nil, -1
	}
	return region, fd
}

package rpc

import (
	"context"
	"io"
	"sync"
)

// ClientStream receives the items of a server-streaming call. It is not safe
// for concurrent Recv calls. Items not received yet are buffered up to a
// small bound; beyond it the connection's reader waits for Recv, so a stream
// that is never read stalls its connection: Close streams you abandon.
type ClientStream struct {
	cc    *clientConn
	cl    *call
	codec Codec
	items chan []byte
	stop  func() bool

	mu     sync.Mutex
	ended  chan struct{} // closed by finish
	closed chan struct{} // closed by Close
	err    error         // io.EOF or *Error, set before ended is closed
	once   sync.Once
}

const streamBuffer = 64

// Stream starts a server-streaming call of method with req.
func (c *Client) Stream(ctx context.Context, method string, req any) (*ClientStream, error) {
	codec := c.opts.Codec
	if codec == nil {
		codec = codecFor(req)
	}
	in, err := codec.Marshal(nil, req)
	if err != nil {
		return nil, Errorf(InvalidArgument, "encode %s request: %v", method, err)
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	if e := cc.acquire(ctx); e != nil {
		return nil, e
	}
	st := &ClientStream{cc: cc, codec: codec, items: make(chan []byte, streamBuffer),
		ended: make(chan struct{}), closed: make(chan struct{})}
	cl := &call{done: make(chan struct{}, 1), stream: st}
	st.cl = cl
	if e := cc.send(ctx, cl, method, in, 1); e != nil {
		cc.release()
		return nil, e
	}
	cc.ensureReader()
	st.stop = context.AfterFunc(ctx, func() { st.abort(ctxError(ctx)) })
	return st, nil
}

func (st *ClientStream) deliver(item []byte) {
	select {
	case st.items <- item:
	case <-st.closed:
	}
}

func (st *ClientStream) finish(err error) {
	st.once.Do(func() {
		if err == nil {
			err = io.EOF
		}
		st.mu.Lock()
		st.err = err
		st.mu.Unlock()
		close(st.ended)
		st.cc.release()
	})
}

func (st *ClientStream) abort(err error) {
	if st.cc.forget(st.cl) {
		st.cc.cancelRemote(st.cl.id, CodeOf(err))
	}
	st.finish(err)
	st.mu.Lock()
	select {
	case <-st.closed:
	default:
		close(st.closed)
	}
	st.mu.Unlock()
}

// RecvRaw returns the next item's bytes (owned by the caller), or io.EOF at
// the end of a successful stream, or the stream's *Error.
func (st *ClientStream) RecvRaw() ([]byte, error) {
	select {
	case it := <-st.items:
		return it, nil
	default:
	}
	select {
	case it := <-st.items:
		return it, nil
	case <-st.ended:
		select {
		case it := <-st.items:
			return it, nil
		default:
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		return nil, st.err
	}
}

// Recv decodes the next item into v; io.EOF ends a successful stream.
func (st *ClientStream) Recv(v any) error {
	b, err := st.RecvRaw()
	if err != nil {
		return err
	}
	if err := st.codec.Unmarshal(b, v); err != nil {
		return Errorf(InvalidArgument, "decode stream item: %v", err)
	}
	return nil
}

// Close abandons the stream (the server's handler sees its ctx canceled).
// Safe to call after the end and more than once.
func (st *ClientStream) Close() error {
	if st.stop != nil {
		st.stop()
	}
	st.abort(&Error{Code: Canceled, Message: "stream closed"})
	return nil
}

package rpc

import (
	"context"

	"github.com/udskit/udskit/internal/shm"
)

// RawView is a response of CallRawView: Bytes is the payload, either in
// place in the connection's shared-memory region or in the caller's dst.
// Call Release once when done with Bytes; the bytes must not be used after
// it. A zero RawView is empty; Release on it does nothing.
type RawView struct {
	b  []byte
	cc *clientConn // set while a slot of the region is held
	d  shm.Desc
}

// Bytes is the response payload, valid until Release.
func (v *RawView) Bytes() []byte { return v.b }

// InPlace reports whether Bytes points into the shared region (no copy was
// made), rather than into the caller's dst.
func (v *RawView) InPlace() bool { return v.cc != nil }

// Release gives the response's slot back to the server (its shm_release
// goes out with the connection's next write, at the latest a millisecond
// later). A held slot is part of the server's half: a caller that never
// releases makes the server wait for space, then fail its calls with
// their deadlines. Safe on a zero or already released RawView.
func (v *RawView) Release() {
	cc := v.cc
	v.b, v.cc = nil, nil
	if cc == nil {
		return
	}
	if x := cc.slotCalls; x != nil {
		if k := x.calls.AreaSlot(true, v.d); k >= 0 { // a call slot's payload area: the slot frees, nothing to release
			x.unview(k)
			return
		}
	}
	cs := cc.shm
	cs.track.Drop(v.d)
	cs.region.Release()
	cs.viewMu.Lock()
	queueRelease(cc.w, v.d, &cs.viewRel)
	cs.viewMu.Unlock()
	if n := cs.relBytes.Add(uint64(v.d.Len)); n >= cs.alloc.Cap()/4 || cc.slotCalls != nil && n >= slotRelBytes {
		cs.relBytes.Store(0)
		cc.w.Push()
	} else if !cs.relArmed.Swap(true) {
		cs.relTimer.Reset(releaseDelay)
	}
}

// CallRawView is CallRaw for a caller that reads the response and lets it
// go: a response that came through the shared region (Linux, a local unix
// socket, 16 KiB or more by default) is not copied out; the view points at
// the server's slot until Release. Any other response is appended to dst
// as by CallRaw. Release the view once done with it, also to reuse dst.
//
// The server can still write the slot's bytes while the caller reads them
// (they are shared memory): use it when the server is trusted or the
// caller reads each byte once (a copy elsewhere, a hash). With unary
// interceptors configured, the response is always copied (CallRaw).
func (c *Client) CallRawView(ctx context.Context, method string, req, dst []byte) (RawView, error) {
	if c.unaryIC != nil {
		out, err := c.CallRaw(ctx, method, req, dst)
		return RawView{b: out}, err
	}
	for attempt := 0; ; attempt++ {
		cc, reserved, err := c.connCall(ctx, len(req))
		if err != nil {
			return RawView{b: dst}, err
		}
		v, err := cc.unaryView(ctx, method, req, dst)
		cc.shmUnreserve(reserved)
		if err == nil {
			return v, nil
		}
		if e, ok := err.(*Error); ok && e.Refused && attempt < 10 && ctx.Err() == nil {
			cc.markDraining()
			continue
		}
		return v, err
	}
}

// shmViewCall is a call's state for CallRawView.
type shmViewCall struct {
	want, held bool
	d          shm.Desc
}

// unaryView is unary for CallRawView.
func (cc *clientConn) unaryView(ctx context.Context, method string, req, dst []byte) (RawView, error) {
	if e := cc.acquire(ctx); e != nil {
		return RawView{b: dst}, e
	}
	defer cc.release()
	if x := cc.slotCalls; x != nil { // call slots (shmcalls.go)
		if out, held, e, ok := x.call(ctx, method, req, dst, true); ok {
			switch {
			case e != nil:
				return RawView{b: dst}, e
			case held.Len != 0:
				return RawView{b: out, cc: cc, d: held}, nil
			}
			return RawView{b: out}, nil
		}
	}
	cl := getCall()
	cl.resp = dst[:0]
	cl.cancelable = ctx.Done() != nil
	cl.mdSink = responseMDSink(ctx)
	cl.view = shmViewCall{want: cc.shm != nil}
	defer func() { cl.view = shmViewCall{}; putCall(cl) }()
	if e := cc.send(ctx, cl, method, req, 0); e != nil {
		return RawView{b: dst}, e
	}
	if e := cc.await(ctx, cl); e != nil {
		return RawView{b: dst}, e
	}
	if cl.code != OK {
		e := &Error{Code: cl.code, Message: cl.msg, Details: cl.details, Refused: cl.refused}
		if cl.code == Unavailable && cl.msg == "" {
			e = cc.lostErr()
		}
		return RawView{b: dst}, e
	}
	if cl.view.held {
		return RawView{b: cl.resp, cc: cc, d: cl.view.d}, nil
	}
	return RawView{b: cl.resp}, nil
}

// shmResponseView is shmResponse for a CallRawView caller: the slot is
// checked and held (tracked, a region reference taken), not copied.
func (cc *clientConn) shmResponseView(b []byte, cl, self *call) (mine bool, err error) {
	d, err := shm.ParseDesc(b)
	if err == nil {
		err = cc.shm.track.Accept(d)
	}
	switch {
	case err != nil:
		e := shmViolation(err)
		cl.code, cl.msg = e.Code, e.Message
	case cc.shm.region.Acquire():
		cl.resp = cc.shm.region.Bytes(d)
		cl.view.held, cl.view.d = true, d
		cc.shm.recv.Add(1)
	default: // the connection is closing
		cc.shm.track.Drop(d)
		cl.code, cl.msg = Unavailable, ""
	}
	if cl == self {
		return true, errOrNil(err)
	}
	cl.done <- struct{}{}
	return false, errOrNil(err)
}

package rpc

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/udskit/udskit/frame"
)

// ClientStream receives the items of a server-streaming call. It is not safe
// for concurrent Recv calls.
//
// Flow control (stream credit, protocol/spec.md section 4.1, part of every
// version-1 peer): the server sends at most 1 MiB (plus one item) ahead of
// what Recv has taken, and Recv grants more as it goes. A stream read slowly,
// or not at all, holds back only itself: the other calls on the connection go
// on. Close streams you abandon: the server's handler stays blocked on credit
// until then.
type ClientStream struct {
	cc    *clientConn
	cl    *call
	codec Codec
	stop  func() bool
	tx    *sendSide  // the request side of a bidi or client-streaming call (bidi_client.go)
	slot  *cliStream // the call's stream slot (shmstreams.go), nil on the socket

	mu          sync.Mutex
	queue       [][]byte      // items delivered, not yet moved to batch
	outstanding int           // cost of the items received and not yet granted back
	arrived     chan struct{} // (buffered 1) the queue went from empty to not
	ended       chan struct{} // closed by finish
	err         error         // io.EOF or *Error, set before ended is closed
	once        sync.Once
	onDone      []func(error) // (mu) run once when the stream ends (OnDone)

	// Recv's own (Recv is not concurrent): the items it takes the queue's
	// contents into, in one swap, and the cost taken since the last grant.
	batch   [][]byte
	next    int
	toGrant int
	// lent (Recv's own) is the item a bidi call's RecvRawView returned
	// last; the next Recv gives it back as spare (mu), the buffer the
	// reader reads the call's next item into (itemBuf).
	lent  []byte
	spare []byte
	// issued (mu) is the start of the last buffer itemBuf gave the reader:
	// only such a buffer is ever reused (an item of another origin, shared
	// memory, is left alone).
	issued *byte
	// owed: a bidi call was handed an item and has not yet sent, waited
	// in Recv or ended (counted in cc.owed; owe and settle).
	owed owedMark
}

// owe marks a bidi call that was just handed a response item: its caller
// is likely about to send one (the reader's, in deliver).
func (st *ClientStream) owe() {
	st.cc.owed.owe(&st.owed)
}

// settle ends st's owed mark: it sends now, waits in Recv, or has ended.
func (st *ClientStream) settle() {
	st.cc.owed.settle(&st.owed)
}

// maxSpare bounds the item buffer a bidi call keeps for reuse.
const maxSpare = 64 << 10

// itemBuf returns the buffer the reader reads an item of n bytes into: the
// spare one of a bidi call when it is large enough, else a new one.
func (st *ClientStream) itemBuf(n uint32) []byte {
	if st.tx == nil || n == 0 || n > maxSpare {
		return make([]byte, 0, n)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	b := st.spare
	st.spare = nil
	if cap(b) < int(n) {
		b = make([]byte, 0, n)
	}
	st.issued = &b[:1][0]
	return b[:0]
}

// giveBack makes the item RecvRawView lent the spare buffer once Recv is
// called again, when itemBuf gave it out last.
func (st *ClientStream) giveBack() {
	b := st.lent
	if b == nil {
		return
	}
	st.lent = nil
	if cap(b) == 0 {
		return
	}
	st.mu.Lock()
	if st.issued == &b[:1][0] {
		st.spare, st.issued = b[:0], nil
	}
	st.mu.Unlock()
}

// grantEvery is how much credit Recv takes before it grants it back: half
// the initial credit, so a reading client never lets the server run dry.
const grantEvery = frame.InitialStreamCredit / 2

// itemCost is what an item counts against stream credit: its length plus a
// frame header, so that empty items are not free (protocol/spec.md, 4.1).
func itemCost(item []byte) int { return len(item) + frame.HeaderSize }

// Stream starts a server-streaming call of method with req.
func (c *Client) Stream(ctx context.Context, method string, req any) (*ClientStream, error) {
	codec := c.opts.Codec
	if codec == nil {
		codec = codecFor(req)
	}
	in, err := codec.Marshal(nil, req)
	if err != nil {
		return nil, encodeError(method+" request", err)
	}
	if ic := c.streamIC; ic != nil {
		st, err := ic(ctx, method, in, c.open)
		if st != nil {
			st.codec = codec
		}
		return st, err
	}
	st, err := c.openStream(ctx, method, in)
	if st != nil {
		st.codec = codec
	}
	return st, err
}

// openStream starts a stream call with the encoded request (Stream without
// the codec and the interceptors).
func (c *Client) openStream(ctx context.Context, method string, in []byte) (*ClientStream, error) {
	cc, err := c.connStream(ctx) // (an in-flight slot taken)
	if err != nil {
		return nil, err
	}
	st := &ClientStream{cc: cc, codec: Raw, arrived: make(chan struct{}, 1),
		ended: make(chan struct{})}
	cl := &call{done: make(chan struct{}, 1), stream: st, mdSink: responseMDSink(ctx)}
	st.cl = cl
	if e := cc.send(ctx, cl, method, in, 1); e != nil {
		// finish releases the in-flight slot once, even if the connection's
		// close, racing with this failed send, has finished the stream too.
		st.finish(e)
		return nil, e
	}
	cc.ensureReader()
	st.stop = context.AfterFunc(ctx, func() { st.abort(ctxError(ctx)) })
	return st, nil
}

// deliver queues an item for Recv; the connection's reader calls it. It
// never waits: a server that overruns its credit is a protocol violation (the
// connection closes), so the queue holds at most 1 MiB plus one item.
func (st *ClientStream) deliver(item []byte) error {
	st.mu.Lock()
	st.outstanding += itemCost(item)
	if limit := frame.InitialStreamCredit + int(st.cc.maxFrame) + frame.HeaderSize; st.outstanding > limit {
		over := st.outstanding - limit
		st.mu.Unlock()
		return &Error{Code: ProtocolViolation, Message: fmt.Sprintf(
			"server sent %d bytes of stream items beyond the credit it was given", over)}
	}
	st.queue = append(st.queue, item)
	first := len(st.queue) == 1
	if st.tx != nil && !st.tx.single && st.slot == nil {
		// Under mu, and not once ended: finish settles after it closed
		// ended under mu, so no mark outlives the call.
		select {
		case <-st.ended:
		default:
			st.owe()
		}
	}
	st.mu.Unlock()
	if first {
		select {
		case st.arrived <- struct{}{}:
		default:
		}
	}
	return nil
}

func (st *ClientStream) finish(err error) {
	st.once.Do(func() {
		if err == nil {
			err = io.EOF
		}
		// The slot first: a caller that saw the end (Recv's io.EOF) and
		// opens its next call finds it free, so a lone caller's next
		// stream never finds its connection busy and grows the pool.
		st.cc.release()
		st.mu.Lock()
		st.err = err
		hooks := st.onDone
		st.onDone = nil
		close(st.ended) // under mu: OnDone sees either the hooks taken or the end
		st.mu.Unlock()
		select { // a bidi Recv waits on arrived alone (awaitItem)
		case st.arrived <- struct{}{}:
		default:
		}
		st.settle()
		for _, f := range hooks {
			f(doneErr(err))
		}
	})
}

// OnDone arranges for f to run once when the stream ends, with nil for a
// stream the server ended successfully and the stream's error otherwise
// (Close makes it a Canceled *Error). If the stream has already ended, f
// runs at once. For interceptors (a span or a timer that must end with the
// stream). f may run on the connection's reading goroutine: it must not
// block.
func (st *ClientStream) OnDone(f func(err error)) {
	st.mu.Lock()
	select {
	case <-st.ended:
		err := st.err
		st.mu.Unlock()
		f(doneErr(err))
		return
	default:
	}
	st.onDone = append(st.onDone, f)
	st.mu.Unlock()
}

func doneErr(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}

func (st *ClientStream) abort(err error) {
	if ss := st.slot; ss != nil {
		ss.leave(CodeOf(err))
	} else if st.cc.forget(st.cl) {
		st.cc.cancelRemote(st.cl.id, CodeOf(err))
	}
	st.finish(err)
}

// RecvRaw returns the next item's bytes (owned by the caller), or io.EOF at
// the end of a successful stream, or the stream's *Error.
func (st *ClientStream) RecvRaw() ([]byte, error) {
	st.giveBack()
	for {
		if st.next < len(st.batch) {
			it := st.batch[st.next]
			st.batch[st.next] = nil
			st.next++
			if st.toGrant += itemCost(it); st.toGrant >= grantEvery {
				st.grant()
			}
			return it, nil
		}
		st.mu.Lock()
		if len(st.queue) > 0 { // take everything queued in one swap
			st.batch, st.queue, st.next = st.queue, st.batch[:0], 0
			st.mu.Unlock()
			continue
		}
		select {
		case <-st.ended: // every item delivered before the end is queued by now
			err := st.err
			st.mu.Unlock()
			return nil, err
		default:
		}
		if st.tx != nil {
			// It waits: not about to send. Under mu, as deliver marks: an
			// item delivered from now on marks it again.
			st.settle()
		}
		st.mu.Unlock()
		if ss := st.slot; ss != nil {
			ss.awaitItem() // the connection's poller delivers (shmstreams.go)
			continue
		}
		if st.tx != nil {
			st.awaitItem() // a bidi call's Recv reads itself (bidi_client.go)
			continue
		}
		select {
		case <-st.arrived:
		case <-st.ended:
		}
	}
}

// grant gives the credit Recv has taken back to the server, unless the
// stream is over.
func (st *ClientStream) grant() {
	n := st.toGrant
	st.toGrant = 0
	if ss := st.slot; ss != nil {
		ss.granted(n)
		return
	}
	st.mu.Lock()
	st.outstanding -= n
	st.mu.Unlock()
	select {
	case <-st.ended:
		return
	default:
	}
	h := frame.Header{Type: frame.TypeStreamCredit, ID: st.cl.id, Aux: uint32(n)}
	st.cc.w.WriteFrame(&h, nil, nil)
}

// Recv decodes the next item into v; io.EOF ends a successful stream.
func (st *ClientStream) Recv(v any) error {
	b, err := st.RecvRaw()
	if err != nil {
		return err
	}
	if err := st.codec.Unmarshal(b, v); err != nil {
		return decodeError("stream item", err)
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

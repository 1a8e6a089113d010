package rpc

// The calls passRoleLocked chooses from, kept as the calls come and go so
// that passing the read role costs the same with 1 call in flight or 1,000
// (a bidi Recv that leads passes it after every item). Each set is a slice
// with O(1) add, remove and pick; a call keeps its position in each set
// (1-based, 0 when not in it). All under cc.mu; only calls in cc.calls are
// in a set.
const (
	setUnary   = iota // calls without a stream
	setWaiting        // those of them waiting in await (cl.waiting)
	setRecv           // bidi calls whose Recv waits for an item (cl.recvWaiting)
	numSets
)

type callSet []*call

func (cs *callSet) add(cl *call, k int) {
	if cl.setPos[k] != 0 {
		return
	}
	*cs = append(*cs, cl)
	cl.setPos[k] = int32(len(*cs))
}

func (cs *callSet) remove(cl *call, k int) {
	i := int(cl.setPos[k]) - 1
	if i < 0 {
		return
	}
	s := *cs
	last := s[len(s)-1]
	s[i] = last
	last.setPos[k] = int32(i + 1)
	s[len(s)-1] = nil
	*cs = s[:len(s)-1]
	cl.setPos[k] = 0
}

// pick returns a call of the set, nil if it is empty.
func (cs callSet) pick() *call {
	if len(cs) == 0 {
		return nil
	}
	return cs[len(cs)-1]
}

// addedLocked files cl, just put in cc.calls, in the sets.
func (cc *clientConn) addedLocked(cl *call) {
	switch {
	case cl.stream == nil:
		cc.sets[setUnary].add(cl, setUnary)
		if cl.waiting {
			cc.sets[setWaiting].add(cl, setWaiting)
		}
	case cl.stream.tx == nil:
		cc.serverStreams++
	case cl.recvWaiting:
		cc.sets[setRecv].add(cl, setRecv)
	}
}

// removedLocked takes cl, just removed from cc.calls, out of the sets.
func (cc *clientConn) removedLocked(cl *call) {
	for k := range numSets {
		cc.sets[k].remove(cl, k)
	}
	if cl.stream != nil && cl.stream.tx == nil {
		cc.serverStreams--
	}
}

// clearSetsLocked empties the sets when cc.calls is emptied at once (close).
func (cc *clientConn) clearSetsLocked(calls map[uint32]*call) {
	for _, cl := range calls {
		cl.setPos = [numSets]int32{}
	}
	cc.sets = [numSets]callSet{}
	cc.serverStreams = 0
}

// setWaitingLocked marks cl waiting in await.
func (cc *clientConn) setWaitingLocked(cl *call) {
	cl.waiting = true
	if cl.inCalls && cl.stream == nil {
		cc.sets[setWaiting].add(cl, setWaiting)
	}
}

// setRecvWaitingLocked marks a bidi call's Recv waiting (or not) for its
// next item.
func (cc *clientConn) setRecvWaitingLocked(cl *call, w bool) {
	cl.recvWaiting = w
	if w && cl.inCalls {
		cc.sets[setRecv].add(cl, setRecv)
	} else {
		cc.sets[setRecv].remove(cl, setRecv)
	}
}

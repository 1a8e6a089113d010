package rpc

import (
	"errors"
	"runtime"
	"sync/atomic"

	"github.com/udskit/udskit/internal/shm"
)

// Stream slots (protocol/spec.md 10.9, hello flag bit 5 shm_streams): on a
// connection whose call slots and client's bell are in use and whose
// hellos both set shm_streams, a client-streaming or bidirectional call
// may live in a call slot instead of on the socket. Each direction is a
// one-frame mailbox in its own half: the client publishes its frames with
// req_seq (and bell), the server its stream_data with str_seq (and cbell);
// each side stores its "taken" word (req_taken, str_taken) once it has
// copied the peer's frame out, and a sender publishes its next frame only
// after the peer took the last one. The call's final frame (stream_end,
// response or error) is the slot's answer as in 10.8 (ans_seq), published
// only once the client took the last stream_data.
//
// Who writes what (besides 10.8's words):
//
//   - the client's Send (one at a time, sendSide.mu) writes slot k's client
//     area, req_len, req_seq and cwant; the client's poller (one per
//     connection) writes str_taken and hands items to Recv;
//   - the server's poller writes req_taken (for every frame it takes from a
//     slot, a unary request too) and hands items to the handler's recv; the
//     handler's send writes slot k's server area, str_len, str_seq and
//     swant; the answer writes the final frame and ans_seq.
//
// Lock invariants. cliStream.mu orders a Send's publication against the
// poller's reading of the final frame: once ended is set (under mu) nothing
// more is published, and the poller knows the last req_seq. srvStream.mu
// orders the server poller's take of a frame against the answer: the answer
// publishes ans_seq = last (under mu) and sets ended; a frame the poller
// takes after that (one the client published racing with the end) is
// dropped and acknowledged by ans_seq = its req_seq, so that the slot
// returns to the client with ans_seq = req_seq as in 10.8.
//
// Flow control: a receiver takes a frame only while its per-call queue
// holds under 1 MiB (the credit of 4.1 and 4.3); otherwise the frame waits
// in the mailbox (held) and so does its sender: only that call stalls.
// Recv's and recv's grants nudge the poller that held a frame.

// errCallOver ends a sender's wait whose call ended meanwhile (awaitTake).
var errCallOver = errors.New("rpc: the stream slot's call is over")

// awaitTake is a sender's wait until its peer took frame want (taken,
// spec 10.9): callerSpins looks, then it stores want in its own word
// (mine, which its taker's wake-up reads) and the peer's (theirs, which
// makes the peer ring its bell when it takes), re-reads taken, and only
// then parks (park: nil to look again, else the wait's end).
//
// A taken word other than want or want-1 is the peer's violation, unless
// over says the call is over: its slot may then serve another call already
// (the client's Send that read its sequence before the final frame came),
// and the wait ends with errCallOver.
func awaitTake(slot int, taken *atomic.Uint32, want uint32, mine, theirs *atomic.Uint32, over func() bool, park func() error) error {
	for i := 0; ; i++ {
		switch v := taken.Load(); v {
		case want:
			return nil
		case want - 1:
		default: // the peer took a frame that was never published, or skipped one
			if over != nil && over() {
				mine.Store(0)
				return errCallOver
			}
			return badStream("a taken word of %d, the frame published last is %d (call slot %d)", v, want, slot)
		}
		if i < callerSpins {
			runtime.Gosched()
			continue
		}
		mine.Store(want)
		theirs.Store(want)
		if taken.Load() == want {
			mine.Store(0)
			return nil
		}
		if err := park(); err != nil {
			mine.Store(0)
			return err
		}
	}
}

// wakeSleeper wakes the peer's sleeper on bell when its sleeping word says
// it sleeps: with numbered sleeps (the bell, spec 10.8) once per number, the
// last number woken kept in woke; without, whenever the word is non-zero.
func wakeSleeper(bell, sleeping, woke *atomic.Uint32, numbered bool) {
	if v := sleeping.Load(); v != 0 && (!numbered || woke.Swap(v) != v) {
		shm.FutexWake(bell, 1)
	}
}

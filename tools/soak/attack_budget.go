package main

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"time"
)

// scale sets the counts of the budget attacks (flags of the same names):
// the counts at which issue 25 found the Go server over 256 MiB.
var scale = struct {
	neverRead, dribble           int
	inflightConns, inflightCalls int
	inflightHold                 time.Duration
}{neverRead: 400, dribble: 20, inflightConns: 25, inflightCalls: 4000, inflightHold: 15 * time.Second}

// budgetAttacks: what the server's memory budgets must bound in total, not
// per connection only: requests and replies queued for many never-reading
// clients, bytes of half-received frames (and NDJSON lines), and what many
// calls in flight hold.
func budgetAttacks() []attack {
	bound := boundFor(serverTimeout)
	dribbleBound := bound + 2*time.Second // 15 MiB to send first
	return []attack{
		{fmt.Sprintf("%d never-reading clients, framed 1 MiB echoes (from stall)", scale.neverRead), scale.neverRead, bound, func(h *hostile) error {
			payload := bytes.Repeat([]byte("r"), 1<<20)
			for i := 0; i < scale.neverRead; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				c.Write(helloBytes())
				id := uint32(0)
				h.writeUntilClosed(c, func() error {
					id++
					_, err := c.Write(requestBytes(id, "echo", len(payload), payload))
					return err
				})
			}
			return nil
		}},
		{fmt.Sprintf("%d conns: 15 of 16 MiB sent, then 1 byte / 5 s (framed)", scale.dribble), scale.dribble, dribbleBound, func(h *hostile) error {
			first := cat(helloBytes(), requestBytes(1, "echo", 16<<20, nil))
			for i := 0; i < scale.dribble; i++ {
				h.dribble(first, 15<<20)
			}
			return nil
		}},
		{fmt.Sprintf("%d conns: 15 of 16 MiB sent, then 1 byte / 5 s (NDJSON)", scale.dribble), scale.dribble, dribbleBound, func(h *hostile) error {
			first := []byte(`{"id":1,"func":"echo","data":"`)
			for i := 0; i < scale.dribble; i++ {
				h.dribble(first, 15<<20)
			}
			return nil
		}},
		{fmt.Sprintf("%d conns × %d calls in flight, held %v", scale.inflightConns, scale.inflightCalls, scale.inflightHold), scale.inflightConns, scale.inflightHold + time.Second, func(h *hostile) error {
			sleep := []byte(fmt.Sprintf(`{"ms":%d}`, (scale.inflightHold + 5*time.Second).Milliseconds()))
			var b []byte
			b = append(b, helloBytes()...)
			for id := uint32(1); id <= uint32(scale.inflightCalls); id++ {
				b = append(b, requestBytes(id, "sleep", len(sleep), sleep)...)
			}
			for i := 0; i < scale.inflightConns; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				go c.Write(b) // blocks while the server does not read: its budget
				// The client holds its calls, then closes: the server must
				// cancel them all and give everything back.
				h.watch(c, func() error {
					time.Sleep(scale.inflightHold)
					return net.ErrClosed
				})
			}
			return nil
		}},
	}
}

// dribble opens a connection that sends first, then n bytes of filler, then
// one byte every 5 s, until the server closes it.
func (h *hostile) dribble(first []byte, n int) {
	c, err := h.dial()
	if err != nil {
		return
	}
	go func() {
		c.SetWriteDeadline(h.start.Add(h.limit))
		if _, err := c.Write(first); err != nil {
			return
		}
		if _, err := c.Write([]byte(strings.Repeat("x", n))); err != nil {
			return
		}
		for {
			time.Sleep(5 * time.Second)
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	h.readUntilClosed(c)
}

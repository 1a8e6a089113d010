package main

import (
	"strings"
	"time"
)

// inFlightAttacks: many calls in flight on few connections, and payloads
// built to be expensive to decode.
func inFlightAttacks(conns int) []attack {
	bound := boundFor(serverTimeout)
	ids := manyIDs(100_000)
	return []attack{
		{"100k ids in flight", 4, time.Second, func(h *hostile) error {
			for i := 0; i < 4; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				go c.Write(ids) // the server closes once over its in-flight limit
				h.readUntilClosed(c)
			}
			return nil
		}},
		{"deep JSON (100k levels), then idle", 20, bound, func(h *hostile) error {
			deep := strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)
			line := []byte(`{"id":1,"func":"echo","data":` + deep + "}\n")
			for i := 0; i < 20; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				go func() {
					for k := 0; k < 5; k++ {
						if _, err := c.Write(line); err != nil {
							return
						}
					}
				}()
				h.readUntilClosed(c)
			}
			return nil
		}},
	}
}

// manyIDs is a hello and n sleep requests (ids 1..n), built once when the
// attack list is made: building it inside the attack, once per connection,
// took 190 ms of the attacker's own CPU on a quiet machine (about 2 s on a
// loaded one), which counted against the server's 1 s bound.
func manyIDs(n uint32) []byte {
	sleep := []byte(`{"ms":3000}`)
	one := len(requestBytes(1, "sleep", len(sleep), sleep))
	b := make([]byte, 0, len(helloBytes())+int(n)*one)
	b = append(b, helloBytes()...)
	for id := uint32(1); id <= n; id++ {
		b = append(b, requestBytes(id, "sleep", len(sleep), sleep)...)
	}
	return b
}

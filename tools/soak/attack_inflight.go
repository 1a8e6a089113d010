package main

import (
	"strings"
	"time"
)

// inFlightAttacks: many calls in flight on few connections, and payloads
// built to be expensive to decode.
func inFlightAttacks(conns int) []attack {
	bound := boundFor(serverTimeout)
	return []attack{
		{"100k ids in flight", 4, time.Second, func(h *hostile) error {
			sleep := []byte(`{"ms":3000}`)
			for i := 0; i < 4; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				var b []byte
				b = append(b, helloBytes()...)
				for id := uint32(1); id <= 100_000; id++ {
					b = append(b, requestBytes(id, "sleep", len(sleep), sleep)...)
				}
				go c.Write(b) // the server closes once over its in-flight limit
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

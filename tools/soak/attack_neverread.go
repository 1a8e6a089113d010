package main

import (
	"bytes"
	"strings"
)

// neverReadAttacks: clients that keep sending requests and never read the
// answers; the server must stop reading them, bound what it queues, and close
// them on its write timeout.
func neverReadAttacks(conns int) []attack {
	bound := boundFor(serverTimeout)
	return []attack{
		{"never reads, sends 1 MiB requests (from stall)", 8, bound, func(h *hostile) error {
			for i := 0; i < 8; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				c.Write(helloBytes())
				payload := bytes.Repeat([]byte("r"), 1<<20)
				id := uint32(0)
				h.writeUntilClosed(c, func() error {
					id++
					_, err := c.Write(requestBytes(id, "echo", len(payload), payload))
					return err
				})
			}
			return nil
		}},
		{"ndjson never reads, 1 MiB lines (from stall)", 8, bound, func(h *hostile) error {
			line := []byte(`{"id":1,"func":"echo","data":"` + strings.Repeat("n", 1<<20) + "\"}\n")
			for i := 0; i < 8; i++ {
				c, err := h.dial()
				if err != nil {
					continue
				}
				h.writeUntilClosed(c, func() error { _, err := c.Write(line); return err })
			}
			return nil
		}},
	}
}

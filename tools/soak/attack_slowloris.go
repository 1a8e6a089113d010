package main

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/udskit/udskit/frame"
)

// slowlorisAttacks: connections that send garbage, a hostile length, or part
// of something and then stall; each must be closed within its bound.
func slowlorisAttacks(conns int) []attack {
	bound := boundFor(serverTimeout)
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 256)
	return []attack{
		{"garbage", conns, time.Second, func(h *hostile) error { return h.many(conns, garbage) }},
		{"4 GiB length", conns, time.Second, func(h *hostile) error {
			hd := frame.Header{Type: frame.TypeRequest, ID: 1, PayloadLen: 0xFFFFFFFF}
			return h.many(conns, cat(helloBytes(), hd.Append(nil)))
		}},
		{"16 MiB frame, 64 KiB sent, stalled", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 16<<20, make([]byte, 64<<10))))
		}},
		{"slowloris: silent (no hello)", conns, bound, func(h *hostile) error { return h.many(conns, nil) }},
		{"slowloris: half a hello", conns, bound, func(h *hostile) error { return h.many(conns, helloBytes()[:8]) }},
		{"slowloris: half a header", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 10, nil)[:8]))
		}},
		{"slowloris: half a head", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 10, nil)[:frame.HeaderSize+3]))
		}},
		{"slowloris: half a payload", conns, bound, func(h *hostile) error {
			return h.many(conns, cat(helloBytes(), requestBytes(1, "echo", 1000, make([]byte, 500))))
		}},
		{"slowloris: ndjson after {", conns, bound, func(h *hostile) error { return h.many(conns, []byte("{")) }},
		{"slowloris: ndjson half a line", conns, bound, func(h *hostile) error {
			return h.many(conns, []byte(`{"id":1,"func":"echo","data":"`+strings.Repeat("x", 1000)))
		}},
	}
}

// idleAttack: many connections that say hello and then nothing; the idle
// timeout (and its goaway) must close them all.
func idleAttack(idle int) attack {
	bound := boundFor(serverTimeout)
	return attack{fmt.Sprintf("%d idle after hello", idle), idle, bound + 2*time.Second, func(h *hostile) error {
		return h.many(idle, helloBytes())
	}}
}

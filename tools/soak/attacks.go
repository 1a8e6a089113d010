package main

import (
	"time"
)

// boundFor is how long after an attack starts its connections must all be
// closed when the server's timeouts are t: a timeout fires within two
// sweeper ticks (a quarter each) after it passes, and an idle udskit
// connection also gets 2 s to leave after its goaway.
func boundFor(t time.Duration) time.Duration { return t + t/2 + 500*time.Millisecond }

// attacks lists every attack, in the order they run.
func attacks(conns, idle int) []attack {
	var all []attack
	all = append(all, slowlorisAttacks(conns)...)
	all = append(all, neverReadAttacks(conns)...)
	all = append(all, inFlightAttacks(conns)...)
	all = append(all, budgetAttacks()...)
	all = append(all, idleAttack(idle))
	return all
}

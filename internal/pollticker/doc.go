// Package pollticker provides tickers that keep no timer in the Go runtime.
//
// Why: while a runtime timer (time.Ticker, time.Timer, time.AfterFunc) is
// pending anywhere in a process, every idle thread that waits for network
// events waits with a timeout (epoll_pwait with the time to the next timer),
// so each of those waits arms and cancels a kernel hrtimer. A lone caller's
// round trip makes each side wait about twice; on the 2-core VM this project
// is measured on, a 16 ms ticker in each process of a bare 64 B echo cost
// about a fifth more CPU per call and a tenth more p50 (docs/performance.md,
// "No runtime timer pending while calls flow").
// udskit's rpc package keeps a few slow tickers running while calls flow
// (the client's idle-connection look, the server's inline-handler watchdog
// and its timeout sweeper); with this package they cost nothing between
// their ticks.
//
// How: on Linux all tickers of a process share one timerfd, armed for the
// earliest tick and read by one goroutine through the runtime's netpoller
// (so the waits of other threads stay untimed). The goroutine starts with
// the first ticker and then stays, parked in that read, for the life of the
// process; the timerfd is its only file descriptor. Elsewhere (macOS), or if
// the timerfd cannot be made, a Ticker is a time.Ticker.
//
// A Ticker behaves like a time.Ticker: C has room for one tick and a slow
// receiver misses ticks rather than receiving a burst; Reset changes the
// period and starts it over; Stop stops ticks without closing C.
package pollticker

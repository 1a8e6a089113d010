// Package bench is the engine behind `udskit bench`: a fair, side-by-side
// request/response benchmark of local IPC transports (udskit rpc, grpc-go,
// a raw fixed-size echo as the floor, a raw length-prefixed echo and
// newline-JSON, each over unix and/or tcp).
//
// The server side runs in a separate process (ServeMain, started by re-exec of
// the same binary), as in real deployments, and reports its own allocation and
// CPU counters over a small control socket so the client can print
// allocations per request and CPU seconds for both sides.
//
// Fairness rules, applied by Run:
//   - every transport sends the same payload bytes (printable ASCII, so the
//     newline-JSON transport needs no escaping) and, per cell, the same number
//     of requests: the count is sized from the slowest transport's warm-up
//     rate so that transport takes about Duration;
//   - warm-up requests are never recorded;
//   - latencies go into HDR histograms (merged, never averaged); in fixed-rate
//     mode (Config.Rate) latency is measured from each request's intended send
//     time, so a stalled server cannot hide its queueing (coordinated omission);
//   - repeats (Config.Repeat) are rounds: each measures every transport once,
//     in rotated order; ratios are taken within a round and reported as the
//     median with its min-max, req/s as the median with the spread and a noisy
//     flag when the spread is large.
//
// Output: WriteTable (aligned text with ratios to grpc-go and to raw),
// WriteJSON, and WriteSVG (grouped bars of requests/s and p99 per payload size
// per transport, log scale).
package bench

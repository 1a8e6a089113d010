// Package capture records unix socket traffic: what tcpdump does for
// network interfaces, for unix domain sockets.
//
// Three ways to see the bytes, one Sink to record them:
//
//   - Interpose (Linux): take a live server's socket path over without
//     stopping the server. The server's socket file is hard-linked aside,
//     a relay socket is bound at a temporary name with the same mode and
//     owner and renamed over the path (rename is atomic, so the path always
//     resolves to a listening socket), every new connection is relayed to the
//     real server and recorded, and on exit the original is renamed back. A
//     state file beside the socket lets Restore (udskit capture --restore)
//     put the original back after the capture was killed.
//   - ProxyTap: a proxy.Tap for proxy.Options that records what a udskit
//     proxy relays.
//   - ServerConn / ClientConn / WrapListener: wrap a program's own
//     connections (rpc.ServerOptions.WrapConn, rpc.ClientOptions.WrapConn);
//     udskit frames are decoded into packet comments (call ids, methods,
//     error codes).
//
// All three write to a record.Sink: package record owns the recording
// vocabulary and the outputs (record.PcapSink, pcapng with a server port
// chosen so that Wireshark's own dissectors apply; record.TextSink, a live
// view like tcpdump -A / -X), port guessing, annotations and loss
// accounting, shared with kernel capture (package kcapture). The names this
// package used to define for them (Sink, Recording, ConnInfo, PcapSink,
// NewPcapSink, CreatePcap, ...) are aliases and forwarders kept for existing
// code.
//
// May import: record, pcapng, proxy, uds, internal packages; never kcapture.
package capture

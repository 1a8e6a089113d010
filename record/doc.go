// Package record is udskit's one recording vocabulary: what every capture
// mode writes to and how it reaches a file or a terminal.
//
// A Sink records connections; Open gives a Recording that takes one
// connection's events (Data, End, Close) from any goroutine. Every way
// udskit sees unix socket traffic writes to it: interposition on a live
// socket path, the proxy tap and the in-process conn wrappers (package
// capture), and kernel capture with eBPF (package kcapture).
//
// This package owns:
//   - the vocabulary: Dir, Peer, ConnInfo, Sink, Recording;
//   - the outputs: PcapSink (pcapng through package pcapng, each connection
//     a synthetic TCP flow on a server port chosen so that Wireshark's own
//     dissectors apply), TextSink (a live view like tcpdump -A / -X) and
//     CreatePcap (a file, rotated files, or stdout);
//   - protocol guessing: SniffPort (from the first bytes) and GuessPort
//     (from the socket's name);
//   - annotations: Annotator names the udskit frames in the bytes going by
//     (call ids, methods, error codes) for packet comments;
//   - loss accounting: modes that can miss bytes say so with Lost and
//     Dropped (LostRecorder, DropRecorder), which every output here marks
//     in what it writes;
//   - the packet count: Limit stops a capture after N data messages, the
//     meaning of udskit capture --count in every mode (tcpdump's -c counts
//     packets the same way).
//
// May import: pcapng, uds, frame, rpc (error code names) and internal
// packages; never capture or kcapture, which import it.
package record

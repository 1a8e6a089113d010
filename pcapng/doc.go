// Package pcapng writes pcapng capture files as a stream, and turns byte
// streams (unix socket connections) into synthetic TCP flows that stock
// Wireshark and tshark decode with their own dissectors.
//
// A Writer emits one Section Header Block, one Interface Description Block
// per Interface (named, for udskit, by the socket path) and one Enhanced
// Packet Block per packet, with nanosecond timestamps (if_tsresol=9) and
// optional comments. Nothing is buffered: the packets of one call go out
// at once (one writev(2) that points at the caller's payload on files and
// pipes, one Write of the joined bytes elsewhere), so a pipe reader
// (tshark -r -, wireshark -k -i -) sees every packet as soon as it is
// written. Options.Async moves the writing to a background goroutine with a
// bounded buffer, and DropWhenFull then leaves payloads out rather than wait
// for a slow disk (counted, and marked in the file).
//
// A Flow is one connection shown as IPv4 TCP over loopback: a three-way
// handshake when it opens, data in segments that fit an IP packet with correct
// sequence and acknowledgement numbers in both directions, FIN on a clean
// close (or half-close) and RST on a reset. Lost marks bytes that were not
// seen (Wireshark then reports "previous segment not captured").
//
//	w, _ := pcapng.NewWriter(f, pcapng.Options{})
//	iface, _ := w.AddInterface("/run/postgresql/.s.PGSQL.5432", "")
//	fl, _ := w.OpenFlow(pcapng.FlowInfo{Interface: iface, ServerPort: 5432, Comment: "client pid 42"}, time.Now())
//	fl.Data(pcapng.ClientToServer, time.Now(), query)
//	fl.Close(false, time.Now())
//
// Every method of Writer and Flow is safe for concurrent use; they serialize
// on the Writer's lock. After the first write error every call returns it.
package pcapng

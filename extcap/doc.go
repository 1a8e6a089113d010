// Package extcap makes udskit a Wireshark extcap interface: the mechanism
// sshdump, ciscodump and androiddump use to appear in Wireshark's (and
// tshark -D's) own interface list.
//
// Wireshark runs every program in its extcap folders in phases, each a
// separate process: --extcap-interfaces (which interfaces this program
// offers), --extcap-dlts and --extcap-config for each interface (the link
// type, and the options its dialog shows), then --capture --fifo PATH with
// the chosen options, writing pcap or pcapng into the fifo until Wireshark
// stops it (SIGTERM) or closes the fifo.
//
// This package writes the answers of the first phases (WriteInterfaces,
// WriteDLTs, WriteConfig, with the listening sockets of this host offered
// as choices: Choices), runs a capture into the fifo (Capture: interposed
// on a socket path, or from the kernel with eBPF), and installs a small
// launcher into the user's personal extcap folder (Install, Folder). The
// command `udskit extcap` is a thin shell over it.
//
// Stopping: Capture returns when its ctx ends (the CLI ends it on SIGTERM
// and SIGINT, which is how Wireshark's stop button and tshark -a ask), when
// the fifo's reader goes away (Wireshark or dumpcap exited; noticed within
// a quarter second even when no traffic flows), or when the output fails.
// An interposed socket is put back in each case, as after Ctrl-C in
// `udskit capture`.
//
// The line format is Wireshark's doc/extcap.4: "interface {value=..}{display=..}",
// "arg {number=N}{call=--x}{display=..}{type=..}", "value {arg=N}{value=..}".
// A field cannot hold '{', '}' or a newline; socket paths come from any
// user of the host, so a path holding one is not offered as a choice
// (it can still be typed), and displayed text has them replaced.
package extcap

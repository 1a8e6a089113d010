package extcap

import (
	"fmt"
	"io"
	"strings"
)

// Interface is the one interface udskit offers.
const Interface = "udskit"

// Capture modes: the values of the --mode option.
const (
	ModeInterpose = "interpose"
	ModeKernel    = "kernel"
)

// DLT is the link type every packet of the capture has: LINKTYPE_RAW
// (101), synthetic IPv4/TCP flows, one per connection (package record).
const DLT = 101

// Version is the extcap program version announced to Wireshark.
const Version = "1.0"

// HelpURL is the page Wireshark's help button opens.
const HelpURL = "https://github.com/udskit/udskit/blob/main/docs/capture.md#wireshark-interface-extcap"

// The calls (command-line options) of the capture options, as Wireshark
// passes them back with --capture. tshark sets them with
// -o extcap.udskit.NAME:VALUE, NAME being the call without "--".
const (
	ArgSocket  = "--socket"
	ArgPID     = "--pid"
	ArgMode    = "--mode"
	ArgSnaplen = "--snaplen"
	ArgPort    = "--port"
)

// Choice is one value offered for the socket option.
type Choice struct {
	Value   string // the socket path
	Display string // what the list shows: the path, its owner, its clients
}

// WriteInterfaces answers --extcap-interfaces.
func WriteInterfaces(w io.Writer) error {
	_, err := fmt.Fprintf(w, "extcap {version=%s}{help=%s}\ninterface {value=%s}{display=%s}\n",
		Version, HelpURL, Interface, "Unix domain sockets (udskit capture)")
	return err
}

// ErrUnknownInterface is returned for an interface this program does not offer.
type ErrUnknownInterface string

func (e ErrUnknownInterface) Error() string {
	return fmt.Sprintf("extcap: unknown interface %q: this program offers %q", string(e), Interface)
}

func checkInterface(iface string) error {
	if iface != Interface {
		return ErrUnknownInterface(iface)
	}
	return nil
}

// WriteDLTs answers --extcap-interface udskit --extcap-dlts.
func WriteDLTs(w io.Writer, iface string) error {
	if err := checkInterface(iface); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "dlt {number=%d}{name=RAW}{display=Unix socket connections as IPv4/TCP flows}\n", DLT)
	return err
}

// WriteConfig answers --extcap-interface udskit --extcap-config: the
// options of the capture dialog, with choices offered for the socket.
func WriteConfig(w io.Writer, iface string, choices []Choice) error {
	if err := checkInterface(iface); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("arg {number=0}{call=" + ArgSocket + "}{display=Socket path}{type=selector}{reload=true}" +
		"{tooltip=The unix socket to record: one of the listening sockets of this host (udskit ls --listening; tshark: -o extcap.udskit.socket:PATH takes any path)}{group=Capture}\n")
	writeChoices(&b, choices)
	b.WriteString("arg {number=1}{call=" + ArgMode + "}{display=Mode}{type=radio}" +
		"{tooltip=interpose: new connections of the socket path, restored when the capture stops; kernel: eBPF, connections already open included (root, BTF)}{group=Capture}\n")
	b.WriteString("value {arg=1}{value=" + ModeInterpose + "}{display=Interpose on the socket path (new connections)}{default=true}\n")
	b.WriteString("value {arg=1}{value=" + ModeKernel + "}{display=Kernel (eBPF): open connections too}\n")
	b.WriteString("arg {number=2}{call=" + ArgPID + "}{display=Process id (kernel mode)}{type=unsigned}{default=0}" +
		"{tooltip=Kernel mode: record every unix socket of this process instead of a socket path (0: use the socket path)}{group=Capture}\n")
	b.WriteString("arg {number=3}{call=" + ArgSnaplen + "}{display=Snapshot length}{type=unsigned}{default=0}" +
		"{tooltip=Keep at most this many bytes of each message (0: all in interpose mode, 64 KiB in kernel mode)}{group=Capture}\n")
	b.WriteString("arg {number=4}{call=" + ArgPort + "}{display=Server TCP port}{type=unsigned}{range=0,65535}{default=0}" +
		"{tooltip=The TCP port the flows show, which picks Wireshark's dissector (0: sniffed from the first bytes or guessed from the socket name)}{group=Capture}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteReload answers --extcap-config --extcap-reload-option OPTION: the
// fresh values of a reloadable option (the socket list).
func WriteReload(w io.Writer, iface, option string, choices []Choice) error {
	if err := checkInterface(iface); err != nil {
		return err
	}
	if strings.TrimLeft(option, "-") != strings.TrimLeft(ArgSocket, "-") {
		return fmt.Errorf("extcap: option %q cannot be reloaded (only %s)", option, ArgSocket)
	}
	var b strings.Builder
	writeChoices(&b, choices)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeChoices(b *strings.Builder, choices []Choice) {
	for _, c := range choices {
		if !fieldSafe(c.Value) {
			continue // cannot be written as a field; the user can type it
		}
		fmt.Fprintf(b, "value {arg=0}{value=%s}{display=%s}\n", c.Value, clean(c.Display))
	}
}

// fieldSafe reports whether s can be one {field=...} value unchanged.
func fieldSafe(s string) bool {
	return s != "" && !strings.ContainsAny(s, "{}\r\n\x00")
}

// clean makes display text safe for a field.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '{':
			return '('
		case '}':
			return ')'
		case '\r', '\n', 0:
			return ' '
		}
		return r
	}, s)
}

package socklist

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

func procsString(ps []Proc) string {
	if len(ps) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(ps))
	for i, p := range ps {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("+%d more", len(ps)-3))
			break
		}
		parts = append(parts, strconv.Itoa(p.PID)+"/"+p.Command)
	}
	return strings.Join(parts, ",")
}

// WriteTable prints socks as the table `udskit ls` shows: path (or @name, or
// "(unnamed)"), the socket file's mode and owner:group (StatFiles; "-" when
// none), type, state, holders, and for listeners their clients and
// backlog (and, after doctor.ProbeUdskit, a udskit server's shared-memory fill
// level), for connections their peer.
func WriteTable(w io.Writer, socks []Socket) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tMODE\tOWNER\tTYPE\tSTATE\tPID/COMMAND\tDETAIL")
	for _, s := range socks {
		name := s.Path
		if name == "" {
			name = "(unnamed)"
		}
		var detail string
		switch {
		case s.Listen != nil:
			l := s.Listen
			detail = fmt.Sprintf("%s (%d accepted, %d pending)", plural(l.Clients, "client"), l.Accepted, l.Pending)
			if l.Backlog >= 0 {
				detail += fmt.Sprintf(", backlog %d", l.Backlog)
			}
			if len(l.ClientPIDs) > 0 {
				pids := make([]string, 0, len(l.ClientPIDs))
				for _, p := range l.ClientPIDs {
					pids = append(pids, strconv.Itoa(p))
				}
				word := "pids"
				if len(pids) == 1 {
					word = "pid"
				}
				detail += ", client " + word + " " + strings.Join(pids, ",")
			}
			if u := UdskitSummary(s.Udskit); u != "" {
				detail += "; " + u
			}
		case s.PeerInode != 0:
			detail = "peer " + procsString(s.Peer)
			if len(s.Peer) == 0 {
				detail += fmt.Sprintf(" (inode %d)", s.PeerInode)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, dash(s.Mode), dash(s.Owner), s.Type, s.State, procsString(s.Procs), detail)
	}
	tw.Flush()
}

// plural says "1 client", "0 clients", "2 clients".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/socklist"
)

func init() {
	register(func() *cobra.Command {
		var f socklist.Filter
		var asJSON, noDiag bool
		cmd := &cobra.Command{
			Use:   "ls [PATH-GLOB]",
			Short: "List unix sockets with their owner, peer, clients and backlog",
			Long: `List the unix domain sockets of this host (this network namespace), like ss -x and
lsof -U combined: path (or @abstract, or unnamed), type, state, owning pid and
command; for listeners the number of connected clients (accepted + waiting in
accept()) and the listen backlog; for connections the peer pid and command.

Data comes from sock_diag netlink (as ss uses), /proc/net/unix as a fallback, and
/proc/PID/fd for owners. Unprivileged it still lists every socket, but cannot
name the owners of other users' sockets; it says how many processes it could
not see. Pids are a snapshot: they can exit and be reused.

PATH-GLOB filters on the bound name (path.Match syntax; a pattern without '/' or
'@' also matches the base name, so '*.sock' and '.s.PGSQL.*' work).`,
			Example: `  udskit ls                     # everything
  udskit ls --listening         # servers only
  udskit ls '.s.PGSQL.*'        # PostgreSQL sockets anywhere
  udskit ls --pid 1234 --json   # what pid 1234 holds, as JSON`,
			Args: cobra.MaximumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if len(args) == 1 {
					f.Glob = args[0]
				}
				snap, err := socklist.List(cmd.Context(), socklist.Options{NoDiag: noDiag})
				if err != nil {
					return err
				}
				socks := snap.Select(f)
				out := cmd.OutOrStdout()
				if asJSON {
					if socks == nil {
						socks = []socklist.Socket{}
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(struct {
						Sockets    []socklist.Socket `json:"sockets"`
						Source     string            `json:"source"`
						Unreadable int               `json:"unreadable_processes"`
						Notes      []string          `json:"notes,omitempty"`
					}{socks, snap.Source, snap.Unreadable, snap.Notes})
				}
				printSockets(out, socks)
				for _, n := range snap.Notes {
					fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
				}
				return nil
			},
		}
		cmd.Flags().BoolVarP(&f.Listening, "listening", "l", false, "show listening sockets only")
		cmd.Flags().IntVarP(&f.PID, "pid", "p", 0, "show sockets held by this pid only")
		cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (fields documented in docs/ls.md)")
		cmd.Flags().BoolVar(&noDiag, "no-diag", false, "read /proc/net/unix only (no sock_diag: no peers or queues)")
		return cmd
	})
}

func procsString(ps []socklist.Proc) string {
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

func printSockets(w io.Writer, socks []socklist.Socket) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tTYPE\tSTATE\tPID/COMMAND\tDETAIL")
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
		case s.PeerInode != 0:
			detail = "peer " + procsString(s.Peer)
			if len(s.Peer) == 0 {
				detail += fmt.Sprintf(" (inode %d)", s.PeerInode)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, s.Type, s.State, procsString(s.Procs), detail)
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

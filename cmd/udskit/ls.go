package main

import (
	"encoding/json"
	"fmt"

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
				if f.PID < 0 {
					return usage(fmt.Errorf("--pid %d: want a process id (1 or more)", f.PID))
				}
				if len(args) == 1 {
					f.Glob = args[0]
				}
				snap, err := socklist.List(cmd.Context(), socklist.Options{NoDiag: noDiag})
				if err != nil {
					return err
				}
				socks := snap.Select(f)
				socklist.StatFiles(socks)
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
				socklist.WriteTable(out, socks)
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

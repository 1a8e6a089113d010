package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/doctor"
	"github.com/udskit/udskit/socklist"
)

func init() {
	register(func() *cobra.Command {
		var f socklist.Filter
		var asJSON, noDiag, stats bool
		var probeTimeout time.Duration
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
'@' also matches the base name, so '*.sock' and '.s.PGSQL.*' work).

--stats asks each listening stream socket listed whether it is a udskit server
and, if so, for its statistics (the standard method udskit.stats): DETAIL then
ends with its shared memory, e.g. "udskit, shm 2 regions 12% full (7.7 MiB of
64 MiB), 0 waits": regions in use (one per connection that negotiated shared
memory), how full the server's halves are, and how many payloads had to wait
for space (back-pressure; not 0: see udskit doctor PATH). --json adds the whole
answer under "udskit". Each socket gets one connection that sends a udskit
hello; other servers see a connection that sends 16 bytes and closes, so narrow
the list with PATH-GLOB or --pid. Sockets held by pid 1 (systemd socket
activation) are not probed: a connection would start their service.`,
			Example: `  udskit ls                     # everything
  udskit ls --listening         # servers only
  udskit ls '.s.PGSQL.*'        # PostgreSQL sockets anywhere
  udskit ls --pid 1234 --json   # what pid 1234 holds, as JSON
  udskit ls --stats '*udskit*'  # udskit servers' shared-memory fill level and waits`,
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
				if stats {
					snap.Notes = append(snap.Notes, doctor.ProbeUdskit(cmd.Context(), socks, doctor.ProbeOptions{Timeout: probeTimeout})...)
				}
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
		cmd.Flags().BoolVar(&stats, "stats", false, "ask listening udskit servers for their statistics: shared-memory regions, fill level, waits (connects to each listening stream socket listed)")
		cmd.Flags().DurationVar(&probeTimeout, "stats-timeout", time.Second, "with --stats: how long each socket may take to answer")
		return cmd
	})
}

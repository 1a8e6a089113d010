package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/doctor"
)

func init() {
	register(func() *cobra.Command {
		var opts doctor.Options
		var asJSON bool
		var rf remoteFlags
		cmd := &cobra.Command{
			Use:   "doctor ADDR",
			Short: "Explain why a socket address cannot be reached",
			Long: `Check, in order, everything that stands between this user and a server at ADDR,
one line each with PASS, WARN, FAIL or SKIP, what it means and the fix:

  address     the address parses (` + "unix:/path, /path, ./rel, @name, tcp:host:port, tls:host:port, ssh://[user@]host[:port]/path" + `)
  length      the path fits the OS limit (107 bytes on Linux)
  directories every parent directory exists and is searchable by you
  dir-safety  WARN when another user could replace the socket: a directory above it
              writable by others without the sticky bit, or a symlink of another user
  exists      the socket file exists
  socket      it is a socket, not a regular file or a directory
  writable    you may write it (connect needs write permission)
  listener    a process listens on it (pid and command), or it is stale
  connect     an actual connect, with the errno explained
  protocol    what the server speaks: listens for a greeting, and sends a harmless
              opening only where the name says which protocol (PostgreSQL SSLRequest,
              Redis PING, HTTP GET /_ping for docker.sock, udskit hello) or --probe asks
  service     for PostgreSQL (.s.PGSQL.N), docker, MySQL/MariaDB and Redis socket names:
              where a live server's socket actually is and the client setting to use
  kernel      inside a container: unix sockets do not cross kernels
  certificate tls: what the server's certificate says (names, SPIFFE ID, issuer, validity
              against this host's clock), read even when it does not verify
For tls: the connect line names the failure (unknown CA, expired certificate or clock skew,
name or SPIFFE ID mismatch, client certificate refused, plaintext server); for ssh:// it
names ssh's (no ssh binary, host key unknown, authentication refused, no ssh server,
remote socket missing, forwarding forbidden), each with the fix.

Run it as the user whose connection fails: permission checks use your identity.
Exit status: 0 only when a connection succeeded, 1 otherwise, 2 for bad usage (an address
that does not parse).`,
			Example: `  udskit doctor /tmp/.s.PGSQL.5432
  udskit doctor /var/run/docker.sock --json
  udskit doctor @myapp --probe none
  udskit doctor tls:db-1:8443 --tls-ca ca.pem --tls-cert web.pem --tls-key web-key.pem
  udskit doctor ssh://deploy@db-1/run/app/app.sock`,
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				switch opts.Probe {
				case "", "none", "http", "postgres", "redis", "udskit":
				default:
					return usage(fmt.Errorf("--probe %q: want one of none, http, postgres, redis, udskit", opts.Probe))
				}
				a, err := parseAddr(args[0])
				if err != nil {
					return err
				}
				if opts.TLS, opts.SSH, err = rf.dial(a, nil); err != nil {
					return err
				}
				r := doctor.Run(cmd.Context(), args[0], opts)
				out := cmd.OutOrStdout()
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if err := enc.Encode(r); err != nil {
						return err
					}
				} else {
					r.WriteText(out)
				}
				if !r.Connected {
					msg := "no connection"
					if f := r.Failed(); f != nil {
						msg = "no connection (first failed check: " + f.ID + ")"
					}
					return &exitError{code: 1, err: errors.New(msg)}
				}
				return nil
			},
		}
		cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON (fields in docs/doctor.md)")
		cmd.Flags().DurationVar(&opts.Timeout, "timeout", 2*time.Second, "connect timeout")
		cmd.Flags().DurationVar(&opts.SniffTimeout, "sniff-timeout", 300*time.Millisecond, "how long to wait for the server to speak")
		cmd.Flags().StringVar(&opts.Probe, "probe", "", "protocol opening to send if the server is silent: none, http, postgres, redis, udskit (default: by socket name)")
		rf.addClient(cmd.Flags())
		return cmd
	})
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

func init() { register(newHealthCmd) }

func newHealthCmd() *cobra.Command {
	var (
		service string
		wait    bool
		timeout time.Duration
		rf      remoteFlags
	)
	cmd := &cobra.Command{
		Use:   "health [ADDR]",
		Short: "Check a udskit rpc server's health (udskit.health) and exit 0 if it is serving",
		Long: `Calls the standard method udskit.health on the server at ADDR and turns its answer into an
exit code, for Kubernetes exec probes and systemd ExecStartPost=:

  0  serving (prints "serving" on stdout)
  1  draining, not_serving, an unknown --service, or unreachable (stderr says which)
  2  bad usage

Every udskit server (Go, Node, Python) answers udskit.health without registering it, and
reports draining from the moment it starts to shut down (either drain mode). --service asks
about one service the server set a status for (Go: Server.SetHealth).

With --wait it keeps trying until the server is serving or --timeout passes (the socket may not
exist yet): the start-up gate for ExecStartPost= or a script. Without it, one attempt.
Without ADDR it checks the address udskit serve uses without one.

Addresses: ` + uds.AddrForms + "\n" + remoteHelp,
		Example: `  udskit health /run/app/sidecar.sock                 # exit 0 if serving
  udskit health /run/app/sidecar.sock --service db    # one service's status
  udskit health --wait --timeout 30s /run/app.sock    # wait for start-up (systemd ExecStartPost=)
  udskit health tls:db.internal:7443 --tls-ca ca.pem --tls-cert me.pem --tls-key me.key
  udskit health tls:10.0.0.7:7443 --spiffe-socket env --tls-server-spiffe spiffe://prod/ns/app/sa/db

  # Kubernetes:
  #   readinessProbe:
  #     exec: {command: ["udskit", "health", "/sock/sidecar.sock"]}
  # systemd:
  #   ExecStartPost=/usr/bin/udskit health --wait --timeout 30s /run/app/sidecar.sock`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usage(fmt.Errorf("--timeout %v: must be positive", timeout))
			}
			addr, err := addrArg(args)
			if err != nil {
				return err
			}
			tlsConf, sshOpts, err := rf.dialAddr(cmd, addr)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := rpc.ProbeHealth(ctx, addr, rpc.ProbeOptions{Service: service, Wait: wait, Client: rpc.ClientOptions{TLS: tlsConf, SSH: sshOpts}})
			what := addr
			if service != "" {
				what = fmt.Sprintf("service %q at %s", service, addr)
			}
			switch {
			case err != nil:
				var pe *rpc.ProbeError
				if errors.As(err, &pe) && pe.Unreachable {
					return &exitError{code: 1, err: fmt.Errorf("%w\n(no udskit server answers there: not started, stopped, or draining and no longer accepting)", err)}
				}
				return &exitError{code: 1, err: err}
			case st == rpc.HealthServing:
				fmt.Fprintln(cmd.OutOrStdout(), st)
				return nil
			case st == rpc.HealthDraining:
				return &exitError{code: 1, err: fmt.Errorf("draining: %s is shutting down", what)}
			}
			return &exitError{code: 1, err: fmt.Errorf("%s: %s is up but not serving", st, what)}
		},
	}
	f := cmd.Flags()
	f.StringVar(&service, "service", "", "ask about this service instead of the whole server")
	f.BoolVar(&wait, "wait", false, "keep trying until serving or --timeout passes")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "give up after this long (one attempt, or the whole --wait)")
	rf.addClient(f)
	return cmd
}

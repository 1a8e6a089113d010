// Command udskit is the command-line face of the udskit library: serve, call,
// bench, proxy, capture, ls, doctor and timing. Each subcommand lives in its own
// file and registers itself with register; the logic is in library packages.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/udskit/udskit/uds"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// subcommands holds the constructors registered by each subcommand's file.
var subcommands []func() *cobra.Command

// register adds a subcommand; call it from an init func in the subcommand's file.
func register(f func() *cobra.Command) { subcommands = append(subcommands, f) }

// exitError carries a specific exit code out of a command without printing usage.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usage marks err as bad usage: the command exits 2 (1 is left for "ran, and
// failed"). Every command reports a usage mistake through it.
func usage(err error) error { return &exitError{code: 2, err: err} }

// parseAddr parses an address given on the command line; one that does not
// parse is bad usage. Every command reads addresses through it.
func parseAddr(s string) (uds.Addr, error) {
	a, err := uds.ParseAddr(s)
	if err != nil {
		return uds.Addr{}, usage(err)
	}
	return a, nil
}

// parseMode parses a --mode value: octal permission bits. One that does not
// parse is bad usage.
func parseMode(s string) (os.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, usage(fmt.Errorf("--mode %q: want octal permission bits like 0600 or 0660", s))
	}
	return os.FileMode(m), nil
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "udskit",
		Short: "Fast, safe, debuggable local IPC over unix domain sockets",
		Long: `udskit serves, calls, benchmarks, proxies, captures, lists and diagnoses unix domain sockets.

Addresses (everywhere): unix:/path.sock, /path.sock, ./rel.sock, unix:@name or @name
(Linux abstract namespace), tcp:host:port or host:port; off the box (docs/remote.md):
tls:host:port (TLS 1.3, --tls-cert/--tls-key/--tls-ca; mutual with --allow-spiffe) and, to dial,
ssh://[user@]host[:port]/path/to.sock (through your ssh).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmds := make([]*cobra.Command, 0, len(subcommands))
	for _, f := range subcommands {
		cmds = append(cmds, f())
	}
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].Name() < cmds[j].Name() })
	root.AddCommand(cmds...)
	// Bad usage exits 2 everywhere (1 is left for "ran, and failed"): flag
	// parse errors and wrong argument counts included.
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError(c, err) })
	for _, c := range cmds {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return usageError(cmd, err)
				}
				return nil
			}
		}
	}
	return root
}

// usageError gives err exit code 2 and points at the command's help, unless
// it already carries an exit code.
func usageError(c *cobra.Command, err error) error {
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	return usage(fmt.Errorf("%w (see %s --help)", err, c.CommandPath()))
}

func versionString() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if v == "" && ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	if v == "" {
		v = "dev"
	}
	if ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
		v += " " + bi.GoVersion
	}
	return v
}

func init() {
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:   "version",
			Short: "Print the udskit version",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				fmt.Fprintln(cmd.OutOrStdout(), "udskit", versionString())
				return nil
			},
		}
	})
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "udskit:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		if strings.HasPrefix(err.Error(), "unknown command ") {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

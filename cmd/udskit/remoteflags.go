package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/udskit/udskit/spiffetls"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

// remoteFlags are the flags of tls: and ssh:// addresses, shared by serve,
// call, bench and proxy.
type remoteFlags struct {
	cert, key, ca              string
	serverName, serverSPIFFEID string
	allowSPIFFE, allowDNS      []string
	allowAnyCert               bool
	sshArgs                    []string
	ssh                        string
	spiffe                     string
	spiffeFederate             []string
}

// spiffeSource connects to the Workload API of --spiffe-socket ("env":
// $SPIFFE_ENDPOINT_SOCKET) and waits up to 15s for the first SVID. The
// source lives as long as the process.
func (r *remoteFlags) spiffeSource() (*workloadapi.X509Source, error) {
	addr := r.spiffe
	if addr == "env" {
		addr = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return spiffetls.NewSource(ctx, addr)
}

func (r *remoteFlags) addSPIFFE(f *pflag.FlagSet) {
	f.StringVar(&r.spiffe, "spiffe-socket", "", "tls: take the certificate and CA bundle from the SPIFFE Workload API at this address (unix:///run/spire/agent.sock; env: $SPIFFE_ENDPOINT_SOCKET) instead of --tls-* files")
}

const remoteHelp = `
Remote addresses (docs/remote.md):
  tls:HOST:PORT        TCP with TLS 1.3: --tls-cert/--tls-key (PEM; reloaded when they change),
                       --tls-ca for the peer's CA bundle. No plaintext fallback.
  ssh://[USER@]HOST[:PORT]/PATH
                       dial only: a unix socket on another host through your ssh (config, agent,
                       known_hosts, ProxyJump apply; the remote needs only sshd).`

// addTLS adds the certificate flags.
func (r *remoteFlags) addTLS(f *pflag.FlagSet) {
	f.StringVar(&r.cert, "tls-cert", "", "PEM certificate chain for tls: addresses (server: required; client: for mutual TLS)")
	f.StringVar(&r.key, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&r.ca, "tls-ca", "", "PEM CA bundle the peer's certificate must chain to (client default: the system roots)")
}

// addServer adds the flags of a tls: listener.
func (r *remoteFlags) addServer(f *pflag.FlagSet) {
	r.addTLS(f)
	f.StringSliceVar(&r.allowSPIFFE, "allow-spiffe", nil, "tls: only accept clients whose certificate has this SPIFFE ID (repeatable; spiffe://TD/* for a whole trust domain); makes TLS mutual")
	f.StringSliceVar(&r.allowDNS, "allow-dns", nil, "tls: only accept clients whose certificate has this DNS name (repeatable); makes TLS mutual")
	f.BoolVar(&r.allowAnyCert, "allow-any-cert", false, "tls: accept any client with a certificate from --tls-ca (mutual TLS without a name check)")
	r.addSPIFFE(f)
	f.StringSliceVar(&r.spiffeFederate, "spiffe-federate", nil, "with --spiffe-socket: also accept clients of this federated trust domain (repeatable; its bundle comes from the Workload API), each verified against its own trust domain's bundle")
}

// addClient adds the flags of a tls: or ssh:// dialer.
func (r *remoteFlags) addClient(f *pflag.FlagSet) {
	r.addTLS(f)
	f.StringVar(&r.serverName, "tls-server-name", "", "tls: the name the server's certificate must carry (default: the address's host)")
	f.StringVar(&r.serverSPIFFEID, "tls-server-spiffe", "", "tls: the SPIFFE ID the server's certificate must carry, checked instead of a DNS name")
	f.StringArrayVar(&r.sshArgs, "ssh-arg", nil, "ssh://: an extra argument for ssh (repeatable, e.g. --ssh-arg=-i --ssh-arg=KEY)")
	f.StringVar(&r.ssh, "ssh", "ssh", "ssh://: the ssh client to run")
	r.addSPIFFE(f)
}

func (r *remoteFlags) anyTLS() bool {
	return r.cert != "" || r.key != "" || r.ca != "" || r.serverName != "" || r.serverSPIFFEID != "" || r.spiffe != ""
}

func (r *remoteFlags) anyRemotePolicy() bool {
	return len(r.allowSPIFFE) > 0 || len(r.allowDNS) > 0 || r.allowAnyCert
}

func (r *remoteFlags) load(log *slog.Logger) (*tlsfiles.Source, error) {
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: r.cert, Key: r.key, CA: r.ca}, tlsfiles.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%w (--tls-cert, --tls-key, --tls-ca)", err)
	}
	return src, nil
}

// listen fills lopts for a listener on a: the TLS configuration for tls:,
// and one PeerPolicy from local (--allow-uid, may be nil) and the remote
// rules (--allow-spiffe, --allow-dns, --allow-any-cert). A rule the address
// cannot enforce is bad usage.
func (r *remoteFlags) listen(a uds.Addr, local uds.Policy, lopts *uds.ListenOptions, log *slog.Logger) error {
	if a.Kind != uds.TLS {
		if r.anyTLS() {
			return usage(fmt.Errorf("--tls-cert/--tls-key/--tls-ca apply to tls: addresses, not %s", a))
		}
		if r.anyRemotePolicy() {
			return usage(fmt.Errorf("--allow-spiffe/--allow-dns/--allow-any-cert check client certificates: they need a tls: address, not %s", a))
		}
		if local != nil {
			lopts.Policy = local
		}
		return nil
	}
	if r.spiffe != "" && (r.cert != "" || r.key != "" || r.ca != "") {
		return usage(errors.New("--spiffe-socket replaces --tls-cert/--tls-key/--tls-ca: give one or the other"))
	}
	if len(r.spiffeFederate) > 0 && r.spiffe == "" {
		return usage(errors.New("--spiffe-federate takes the federated bundles from the Workload API: it needs --spiffe-socket"))
	}
	if r.spiffe == "" && (r.cert == "" || r.key == "") {
		return usage(errors.New("a tls: address needs --tls-cert and --tls-key, or --spiffe-socket (there is no plaintext fallback)"))
	}
	if r.anyRemotePolicy() && r.ca == "" && r.spiffe == "" {
		return usage(errors.New("--allow-spiffe/--allow-dns/--allow-any-cert need --tls-ca: the CA bundle client certificates are verified against"))
	}
	for _, id := range r.allowSPIFFE {
		if err := uds.ValidSPIFFEID(id); err != nil {
			return usage(fmt.Errorf("--allow-spiffe: %w", err))
		}
	}
	if r.spiffe != "" {
		src, err := r.spiffeSource()
		if err != nil {
			return err
		}
		if lopts.TLS, err = spiffetls.ServerConfig(src, r.spiffeFederate...); err != nil {
			return usage(err)
		}
	} else {
		src, err := r.load(log)
		if err != nil {
			return usage(err)
		}
		lopts.TLS = src.ServerConfig()
	}
	var rules []uds.PeerPolicy
	if local != nil {
		rules = append(rules, local.Local())
	}
	if len(r.allowSPIFFE) > 0 {
		rules = append(rules, uds.AllowSPIFFE(r.allowSPIFFE...))
	}
	if len(r.allowDNS) > 0 {
		rules = append(rules, uds.AllowDNSNames(r.allowDNS...))
	}
	if r.allowAnyCert {
		rules = append(rules, uds.AllowAnyVerified())
	}
	if len(rules) > 0 {
		lopts.PeerPolicy = uds.AnyPeer(rules...)
	}
	return nil
}

// dialAddr parses addr and returns what dial gives for it, its warnings going
// to the command's stderr: the client side of call, call --list and health.
func (r *remoteFlags) dialAddr(cmd *cobra.Command, addr string) (*tls.Config, uds.SSHOptions, error) {
	a, err := parseAddr(addr)
	if err != nil {
		return nil, uds.SSHOptions{}, err
	}
	return r.dial(a, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// dial returns the TLS configuration (nil unless a is tls:) and ssh options
// for dialing a.
func (r *remoteFlags) dial(a uds.Addr, log *slog.Logger) (*tls.Config, uds.SSHOptions, error) {
	sshOpts := uds.SSHOptions{Binary: r.ssh, Args: r.sshArgs}
	if a.Kind != uds.TLS {
		if r.anyTLS() {
			return nil, sshOpts, usage(fmt.Errorf("--tls-* flags apply to tls: addresses, not %s", a))
		}
		return nil, sshOpts, nil
	}
	if r.serverSPIFFEID != "" {
		if err := uds.ValidSPIFFEID(r.serverSPIFFEID); err != nil {
			return nil, sshOpts, usage(fmt.Errorf("--tls-server-spiffe: %w", err))
		}
	}
	if r.spiffe != "" {
		if r.serverSPIFFEID == "" {
			return nil, sshOpts, usage(errors.New("--spiffe-socket needs --tls-server-spiffe: a SPIFFE server is checked by its ID"))
		}
		src, err := r.spiffeSource()
		if err != nil {
			return nil, sshOpts, err
		}
		conf, err := spiffetls.ClientConfig(src, r.serverSPIFFEID)
		return conf, sshOpts, err
	}
	if r.cert == "" && r.ca == "" {
		// The system roots verify the server; no client certificate.
		return tlsfiles.SystemClientConfig(tlsfiles.ClientOptions{ServerName: r.serverName, ServerSPIFFEID: r.serverSPIFFEID}), sshOpts, nil
	}
	src, err := r.load(log)
	if err != nil {
		return nil, sshOpts, usage(err)
	}
	return src.ClientConfig(tlsfiles.ClientOptions{ServerName: r.serverName, ServerSPIFFEID: r.serverSPIFFEID}), sshOpts, nil
}

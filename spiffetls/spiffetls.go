package spiffetls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/udskit/udskit/tlsfiles"
)

// Source is what the configurations draw from: the workload's current
// X.509-SVID and the bundles it trusts. *workloadapi.X509Source is one.
type Source interface {
	x509svid.Source
	x509bundle.Source
}

// NewSource connects to the Workload API at addr ("unix:///run/spire/agent.sock";
// "" uses $SPIFFE_ENDPOINT_SOCKET) and waits for the first SVID (within ctx).
// Close it when done.
func NewSource(ctx context.Context, addr string) (*workloadapi.X509Source, error) {
	var opts []workloadapi.X509SourceOption
	if addr != "" {
		opts = append(opts, workloadapi.WithClientOptions(workloadapi.WithAddr(addr)))
	}
	src, err := workloadapi.NewX509Source(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("spiffetls: Workload API %s: %w", addrWords(addr), err)
	}
	return src, nil
}

func addrWords(addr string) string {
	if addr == "" {
		return "($SPIFFE_ENDPOINT_SOCKET)"
	}
	return addr
}

// current returns the SVID as a certificate and the pool of its own trust
// domain's bundle.
func current(src Source) (*tls.Certificate, *x509.CertPool, error) {
	svid, err := src.GetX509SVID()
	if err != nil {
		return nil, nil, fmt.Errorf("spiffetls: no X.509-SVID: %w", err)
	}
	if len(svid.Certificates) == 0 {
		return nil, nil, errors.New("spiffetls: an X.509-SVID without certificates")
	}
	cert := &tls.Certificate{PrivateKey: svid.PrivateKey, Leaf: svid.Certificates[0]}
	for _, c := range svid.Certificates {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	b, err := src.GetX509BundleForTrustDomain(svid.ID.TrustDomain())
	if err != nil {
		return nil, nil, fmt.Errorf("spiffetls: no bundle for %s: %w", svid.ID.TrustDomain(), err)
	}
	pool := x509.NewCertPool()
	for _, ca := range b.X509Authorities() {
		pool.AddCert(ca)
	}
	return cert, pool, nil
}

// ServerConfig returns a server configuration serving the current SVID and
// verifying client SVIDs against the current bundle of the SVID's trust
// domain (client certificates verified when sent; uds.Listen requires them
// when a PeerPolicy is set). TLS 1.3 only. Each handshake takes the current
// SVID and bundles, so rotations need nothing.
//
// federatesWith names other trust domains ("partner.example" or
// "spiffe://partner.example") whose workloads may connect too (SPIFFE
// federation): their bundles come from the same source (the Workload API
// delivers the bundles of the trust domains the registration federates
// with). A client certificate must chain to the bundle of its own SPIFFE
// ID's trust domain: a federated trust domain's CA can never vouch for an ID
// of another trust domain. A trust domain listed whose bundle the source
// does not hold (yet) admits no one.
func ServerConfig(src Source, federatesWith ...string) (*tls.Config, error) {
	var feds []spiffeid.TrustDomain
	for _, name := range federatesWith {
		td, err := spiffeid.TrustDomainFromString(name)
		if err != nil {
			return nil, fmt.Errorf("spiffetls: federated trust domain %q: %w", name, err)
		}
		feds = append(feds, td)
	}
	build := func() (*tls.Config, error) {
		cert, pool, err := current(src)
		if err != nil {
			return nil, err
		}
		own, err := x509svid.IDFromCert(cert.Leaf)
		if err != nil {
			return nil, fmt.Errorf("spiffetls: the SVID has no SPIFFE ID: %w", err)
		}
		allowed := map[spiffeid.TrustDomain]bool{own.TrustDomain(): true}
		for _, td := range feds {
			if b, err := src.GetX509BundleForTrustDomain(td); err == nil {
				allowed[td] = true
				for _, ca := range b.X509Authorities() {
					pool.AddCert(ca)
				}
			}
		}
		conf := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
			ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven}
		if len(feds) > 0 {
			conf.VerifyConnection = func(cs tls.ConnectionState) error {
				return checkTrustDomain(cs, src, own.TrustDomain(), allowed)
			}
		}
		return conf, nil
	}
	base, err := build()
	if err != nil {
		return nil, err
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return build() }
	return base, nil
}

// checkTrustDomain runs after the standard chain verification against the
// union of the allowed bundles: the client's chain must end at a CA of the
// bundle of its own SPIFFE ID's trust domain (or, with no SPIFFE ID, of the
// server's own trust domain), and that trust domain must be allowed.
func checkTrustDomain(cs tls.ConnectionState, src Source, own spiffeid.TrustDomain, allowed map[spiffeid.TrustDomain]bool) error {
	if len(cs.PeerCertificates) == 0 {
		return nil // no client certificate (uds.Listen requires one when a PeerPolicy is set)
	}
	td := own
	if id, err := x509svid.IDFromCert(cs.PeerCertificates[0]); err == nil {
		td = id.TrustDomain()
	}
	if !allowed[td] {
		return fmt.Errorf("spiffetls: client of trust domain %q, which this server does not federate with", td)
	}
	b, err := src.GetX509BundleForTrustDomain(td)
	if err != nil {
		return fmt.Errorf("spiffetls: no bundle for the client's trust domain %q: %w", td, err)
	}
	for _, chain := range cs.VerifiedChains {
		if len(chain) > 0 && b.HasX509Authority(chain[len(chain)-1]) {
			return nil
		}
	}
	return fmt.Errorf("spiffetls: the client's certificate (trust domain %q) is not signed by that trust domain's CA", td)
}

// ClientConfig returns a client configuration that presents the current SVID
// and accepts only a server whose SVID verifies against the current bundle
// of serverID's trust domain and is serverID
// ("spiffe://prod.example/ns/app/sa/db"). A server in another trust domain
// (federation) is verified against that trust domain's bundle, which the
// source holds when the workload's registration federates with it. TLS 1.3
// only.
func ClientConfig(src Source, serverID string) (*tls.Config, error) {
	if _, _, err := current(src); err != nil {
		return nil, err
	}
	sid, err := spiffeid.FromString(serverID)
	if err != nil {
		return nil, fmt.Errorf("spiffetls: server ID %q: %w", serverID, err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Standard verification replaced (the bundle changes between
		// handshakes), not skipped: VerifyConnection verifies the chain and
		// the SPIFFE ID.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			b, err := src.GetX509BundleForTrustDomain(sid.TrustDomain())
			if err != nil {
				return fmt.Errorf("spiffetls: no bundle for the server's trust domain %q (does this workload federate with it?): %w", sid.TrustDomain(), err)
			}
			pool := x509.NewCertPool()
			for _, ca := range b.X509Authorities() {
				pool.AddCert(ca)
			}
			return tlsfiles.VerifyServer(cs, pool, tlsfiles.ClientOptions{ServerSPIFFEID: serverID})
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := current(src)
			return cert, err
		},
	}, nil
}

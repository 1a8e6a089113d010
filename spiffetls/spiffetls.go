package spiffetls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
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
// SVID and bundle, so rotations need nothing.
func ServerConfig(src Source) (*tls.Config, error) {
	build := func() (*tls.Config, error) {
		cert, pool, err := current(src)
		if err != nil {
			return nil, err
		}
		return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
			ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven}, nil
	}
	base, err := build()
	if err != nil {
		return nil, err
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return build() }
	return base, nil
}

// ClientConfig returns a client configuration that presents the current SVID
// and accepts only a server whose SVID verifies against the current bundle
// and is serverID ("spiffe://prod.example/ns/app/sa/db"). TLS 1.3 only.
func ClientConfig(src Source, serverID string) (*tls.Config, error) {
	if _, _, err := current(src); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Standard verification replaced (the bundle changes between
		// handshakes), not skipped: VerifyConnection verifies the chain and
		// the SPIFFE ID.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool, err := current(src)
			if err != nil {
				return err
			}
			return tlsfiles.VerifyServer(cs, pool, tlsfiles.ClientOptions{ServerSPIFFEID: serverID})
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := current(src)
			return cert, err
		},
	}, nil
}

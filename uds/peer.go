package uds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
)

// Peer is who is at the other end of a connection, in one model for local
// and remote peers:
//
//   - a local process on a unix socket: HasCred, with the uid, gid and pid
//     the kernel reported at connect time (Cred);
//   - a remote workload on a tls: connection: Remote, its verified X.509
//     identity (subject, DNS and URI SANs, and the SPIFFE ID when the URI
//     SAN is one).
//
// A peer with neither (plain tcp:, or a TLS client that sent no certificate
// where none was required) is anonymous: Anonymous reports true.
type Peer struct {
	Cred    Cred
	HasCred bool
	Remote  *RemoteID
}

// RemoteID is the identity a TLS peer proved with a certificate that
// verified against the configured CA bundle (never an unverified one).
type RemoteID struct {
	// Subject is the leaf certificate's subject (RFC 2253 form).
	Subject string
	// CommonName is the subject's CN, for logs; authorize on SANs.
	CommonName string
	DNSNames   []string
	URIs       []string
	// SPIFFEID is the URI SAN when the certificate is an X.509-SVID: exactly
	// one URI SAN, with the scheme spiffe. Empty otherwise.
	SPIFFEID string
	// Leaf is the verified leaf certificate.
	Leaf *x509.Certificate
}

// Anonymous reports whether nothing is known about the peer.
func (p Peer) Anonymous() bool { return !p.HasCred && p.Remote == nil }

func (p Peer) String() string {
	switch {
	case p.HasCred:
		return "local " + p.Cred.String()
	case p.Remote != nil && p.Remote.SPIFFEID != "":
		return "remote " + p.Remote.SPIFFEID
	case p.Remote != nil:
		return "remote " + p.Remote.Subject
	}
	return "anonymous"
}

// RemoteIDOf makes a RemoteID from a verified leaf certificate.
func RemoteIDOf(leaf *x509.Certificate) *RemoteID {
	id := &RemoteID{Subject: leaf.Subject.String(), CommonName: leaf.Subject.CommonName, DNSNames: leaf.DNSNames, Leaf: leaf}
	for _, u := range leaf.URIs {
		id.URIs = append(id.URIs, u.String())
	}
	if len(leaf.URIs) == 1 && leaf.URIs[0].Scheme == "spiffe" {
		id.SPIFFEID = leaf.URIs[0].String()
	}
	return id
}

// PeerFromTLS returns the verified identity of the peer of a TLS connection
// state: nil when its certificate was not verified (or none was sent).
func PeerFromTLS(cs tls.ConnectionState) *RemoteID {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	return RemoteIDOf(cs.VerifiedChains[0][0])
}

// PeerOf returns the peer of a conn accepted by a Listener (or a TLS or
// unix conn made elsewhere): kernel credentials for a unix socket, the
// verified certificate identity for TLS.
func PeerOf(c net.Conn) Peer {
	if uc, ok := c.(*Conn); ok {
		return uc.Peer()
	}
	if tc, ok := c.(*tls.Conn); ok {
		return Peer{Remote: PeerFromTLS(tc.ConnectionState())}
	}
	cr, ok := CredOf(c)
	return Peer{Cred: cr, HasCred: ok}
}

// PeerPolicy decides whether a peer, local or remote, may talk to a
// listener: nil allows, an error (the reason; wrap ErrPeerRefused) refuses.
// It runs before one application byte of the peer is read: for unix sockets
// right after accept, for TLS inside the handshake, so a refused client's
// handshake fails with an alert. Compose with AnyPeer and AllPeers; a
// kernel-credential Policy becomes a PeerPolicy with Policy.Local.
type PeerPolicy func(Peer) error

// Local turns a kernel-credential Policy into a PeerPolicy that applies it
// to local peers and refuses every remote or anonymous one.
func (p Policy) Local() PeerPolicy {
	return func(pr Peer) error {
		if !pr.HasCred {
			return fmt.Errorf("%w: %s: this rule is for local peers (uid/gid), and the peer is not local", ErrPeerRefused, pr)
		}
		return p(pr.Cred)
	}
}

// AnyPeer allows a peer that at least one of ps allows (e.g. uid 1000
// locally OR a SPIFFE ID remotely).
func AnyPeer(ps ...PeerPolicy) PeerPolicy {
	return func(pr Peer) error {
		var errs []error
		for _, p := range ps {
			err := p(pr)
			if err == nil {
				return nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return fmt.Errorf("%w: empty AnyPeer", ErrPeerRefused)
		}
		return errors.Join(errs...)
	}
}

// AllPeers allows a peer that every one of ps allows.
func AllPeers(ps ...PeerPolicy) PeerPolicy {
	return func(pr Peer) error {
		for _, p := range ps {
			if err := p(pr); err != nil {
				return err
			}
		}
		return nil
	}
}

func remoteOnly(pr Peer, what string) (*RemoteID, error) {
	if pr.Remote == nil {
		return nil, fmt.Errorf("%w: %s: this rule wants a verified client certificate (%s)", ErrPeerRefused, pr, what)
	}
	return pr.Remote, nil
}

// AllowSPIFFE allows remote peers whose SPIFFE ID is one of ids
// ("spiffe://prod.example/ns/app/sa/web"), or, for an id ending in "/*",
// any SPIFFE ID under that prefix ("spiffe://prod.example/*": the whole
// trust domain).
func AllowSPIFFE(ids ...string) PeerPolicy {
	return func(pr Peer) error {
		r, err := remoteOnly(pr, "a SPIFFE ID")
		if err != nil {
			return err
		}
		if r.SPIFFEID == "" {
			return fmt.Errorf("%w: certificate %q has no SPIFFE ID (want one of %v)", ErrPeerRefused, r.Subject, ids)
		}
		for _, id := range ids {
			if prefix, ok := strings.CutSuffix(id, "/*"); ok {
				if strings.HasPrefix(r.SPIFFEID, prefix+"/") {
					return nil
				}
			} else if r.SPIFFEID == id {
				return nil
			}
		}
		return fmt.Errorf("%w: SPIFFE ID %s not in %v", ErrPeerRefused, r.SPIFFEID, ids)
	}
}

// AllowDNSNames allows remote peers whose certificate has one of names as
// a DNS SAN.
func AllowDNSNames(names ...string) PeerPolicy {
	return func(pr Peer) error {
		r, err := remoteOnly(pr, "a DNS name")
		if err != nil {
			return err
		}
		for _, n := range r.DNSNames {
			if slices.Contains(names, n) {
				return nil
			}
		}
		return fmt.Errorf("%w: certificate DNS names %v, none in %v", ErrPeerRefused, r.DNSNames, names)
	}
}

// AllowAnyVerified allows any remote peer with a verified client
// certificate: every workload the CA bundle vouches for.
func AllowAnyVerified() PeerPolicy {
	return func(pr Peer) error {
		_, err := remoteOnly(pr, "any verified certificate")
		return err
	}
}

// ValidSPIFFEID checks the form spiffe://trust-domain/path (or a trailing
// "/*" pattern as AllowSPIFFE takes), for flags and configs.
func ValidSPIFFEID(id string) error {
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return fmt.Errorf("SPIFFE ID %q: want spiffe://trust-domain/path", id)
	}
	td, _, _ := strings.Cut(rest, "/")
	if td == "" || strings.ToLower(td) != td || strings.ContainsAny(td, ":@ ") {
		return fmt.Errorf("SPIFFE ID %q: the trust domain %q must be a lower-case name without port or user", id, td)
	}
	return nil
}

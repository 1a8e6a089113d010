package uds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// DefaultTLSHandshakeTimeout bounds a tls: listener's handshake with one
// client when ListenOptions.TLSHandshakeTimeout is 0.
const DefaultTLSHandshakeTimeout = 10 * time.Second

// maxPendingHandshakes bounds the TLS handshakes a listener runs at once: a
// flood of slow clients waits in the kernel's backlog, not in our memory.
const maxPendingHandshakes = 256

// ErrNoTLSConfig is returned for a tls: address without a TLS configuration.
var ErrNoTLSConfig = errors.New("a tls: address needs a TLS configuration (certificate and key; CLI: --tls-cert, --tls-key, --tls-ca); there is no plaintext fallback")

// ErrPolicyNeedsCA is returned for a tls: listener with a PeerPolicy but no
// CA bundle to verify client certificates against.
var ErrPolicyNeedsCA = errors.New("a peer policy on tls: needs a CA bundle to verify client certificates (tls.Config.ClientCAs; CLI: --tls-ca)")

// serverTLSConfig returns the configuration a tls: listener uses: TLS 1.3
// unless base says otherwise, client certificates required and verified when
// policy is set, and policy run inside the handshake, on the verified
// identity, before any application byte.
func serverTLSConfig(base *tls.Config, policy PeerPolicy) (*tls.Config, error) {
	if base == nil {
		return nil, ErrNoTLSConfig
	}
	if base.Certificates == nil && base.GetCertificate == nil && base.GetConfigForClient == nil {
		return nil, fmt.Errorf("%w: the configuration has no certificate", ErrNoTLSConfig)
	}
	if policy != nil && base.ClientCAs == nil {
		// Checked here even when GetConfigForClient supplies the current
		// pool: a listener that could never verify anyone fails at once.
		return nil, ErrPolicyNeedsCA
	}
	harden := func(c *tls.Config) error {
		if c.MinVersion == 0 {
			c.MinVersion = tls.VersionTLS13
		}
		if policy == nil {
			return nil
		}
		if c.ClientCAs == nil {
			return ErrPolicyNeedsCA
		}
		// A policy asks for the client's identity: mutual TLS.
		c.ClientAuth = tls.RequireAndVerifyClientCert
		prev := c.VerifyConnection
		roots := c.ClientCAs
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if prev != nil {
				if err := prev(cs); err != nil {
					return err
				}
			}
			if cs.DidResume && len(cs.PeerCertificates) > 0 {
				// A resumed session carries the chain verified back then:
				// verify it against today's CA bundle (rotated, or a CA
				// removed), not only its expiry, as Go does.
				inter := x509.NewCertPool()
				for _, c := range cs.PeerCertificates[1:] {
					inter.AddCert(c)
				}
				if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
					KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
					return fmt.Errorf("resumed session: the client's certificate no longer verifies: %w", err)
				}
			}
			return policy(Peer{Remote: PeerFromTLS(cs)})
		}
		return nil
	}
	c := base.Clone()
	if err := harden(c); err != nil && base.GetConfigForClient == nil {
		return nil, err
	}
	if get := base.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hi)
			if err != nil || cc == nil {
				return cc, err
			}
			cc = cc.Clone()
			cc.GetConfigForClient = nil
			if err := harden(cc); err != nil {
				return nil, err
			}
			return cc, nil
		}
	}
	return c, nil
}

// tlsListener accepts TCP connections and hands out only those whose TLS
// handshake (and, inside it, the peer policy) succeeded. Handshakes run
// concurrently, each bounded by a timeout, so one slow client holds up no
// other.
type tlsListener struct {
	net.Listener
	conf    *tls.Config
	timeout time.Duration
	onFail  func(raw net.Conn, err error)

	out       chan net.Conn
	errc      chan error
	sem       chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
	startOnce sync.Once
}

func newTLSListener(inner net.Listener, conf *tls.Config, timeout time.Duration, onFail func(net.Conn, error)) *tlsListener {
	if timeout <= 0 {
		timeout = DefaultTLSHandshakeTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &tlsListener{Listener: inner, conf: conf, timeout: timeout, onFail: onFail,
		out: make(chan net.Conn), errc: make(chan error), sem: make(chan struct{}, maxPendingHandshakes),
		ctx: ctx, cancel: cancel}
}

func (l *tlsListener) Accept() (net.Conn, error) {
	l.startOnce.Do(func() { go l.loop() })
	select {
	case c := <-l.out:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (l *tlsListener) Close() error {
	l.cancel()
	return l.Listener.Close()
}

func (l *tlsListener) loop() {
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		raw, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			select {
			case l.errc <- err:
			case <-l.ctx.Done():
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go l.handshake(raw)
	}
}

// alertNotTLS is a TLS alert record (fatal, unexpected_message) sent to a
// client that does not speak TLS: a udskit client reads it as "this server
// speaks TLS" (LooksLikeTLS) instead of a bare closed connection.
var alertNotTLS = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a}

func (l *tlsListener) handshake(raw net.Conn) {
	defer func() { <-l.sem }()
	tc := tls.Server(raw, l.conf)
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			raw.SetWriteDeadline(time.Now().Add(time.Second))
			raw.Write(alertNotTLS)
			err = fmt.Errorf("a client that does not speak TLS (first bytes %q) on a tls: port: %w", rh.RecordHeader[:], err)
		}
		if l.onFail != nil {
			l.onFail(raw, err)
		}
		raw.Close()
		return
	}
	select {
	case l.out <- tc:
	case <-l.ctx.Done():
		tc.Close()
	}
}

// LooksLikeTLS reports whether b, the first bytes a server sent, is a TLS
// record (a handshake or an alert): a plaintext client talking to a tls: port.
func LooksLikeTLS(b []byte) bool {
	return len(b) >= 3 && (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03 && b[2] <= 0x04
}

// clientTLSConfig returns the configuration Dial uses for a tls: address:
// TLS 1.3 unless base says otherwise, and the server name from the address
// when base sets none.
func clientTLSConfig(base *tls.Config, hostport string) (*tls.Config, error) {
	if base == nil {
		return nil, ErrNoTLSConfig
	}
	c := base.Clone()
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS13
	}
	if c.ServerName == "" {
		host, _, _ := net.SplitHostPort(hostport)
		if host == "" {
			host = "localhost"
		}
		c.ServerName = host
	}
	if v := c.VerifyConnection; v != nil {
		// The state's ServerName is the SNI sent, which is empty for an IP
		// address: a custom verifier (tlsfiles) gets the name dialed.
		name := c.ServerName
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if cs.ServerName == "" {
				cs.ServerName = name
			}
			return v(cs)
		}
	}
	return c, nil
}

// dialTLS runs the client handshake on raw.
func dialTLS(ctx context.Context, a Addr, raw net.Conn, base *tls.Config) (net.Conn, error) {
	conf, err := clientTLSConfig(base, a.Name)
	if err != nil {
		raw.Close()
		return nil, &DialError{Addr: a, Cause: err.Error(), Err: err}
	}
	tc := tls.Client(raw, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		cause, _ := ExplainTLS(err)
		if cause == "" {
			cause = "TLS handshake failed"
		}
		return nil, &DialError{Addr: a, Cause: cause, Err: err}
	}
	return tc, nil
}

// ExplainTLS says in words why a TLS handshake (or the first read after it:
// in TLS 1.3 a server refuses a client certificate after the client's
// handshake is done) failed, with what to do; ok is false when err is no
// TLS failure it knows.
func ExplainTLS(err error) (cause string, ok bool) {
	var rh tls.RecordHeaderError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var hn x509.HostnameError
	var ve *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rh):
		if strings.HasPrefix(string(rh.RecordHeader[:]), "UDSK") {
			return "the server speaks plaintext udskit, not TLS: dial tcp:HOST:PORT (unencrypted), or serve it with --tls-cert/--tls-key (or behind udskit proxy --listen tls:...)", true
		}
		return fmt.Sprintf("the server does not speak TLS (it answered %q)", rh.RecordHeader[:]), true
	case errors.As(err, &ua):
		return "unknown CA: the server's certificate is not signed by a CA in the trusted bundle (--tls-ca)", true
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return fmt.Sprintf("certificate expired or not yet valid: %s (if the certificate was just issued, check the clocks: clock skew)", ci.Detail), true
	case errors.As(err, &hn):
		return fmt.Sprintf("name mismatch: %v (pass the server's name with --tls-server-name, or its SPIFFE ID with --tls-server-spiffe)", hn), true
	case errors.As(err, &ve):
		return "the server's certificate did not verify: " + ve.Err.Error(), true
	}
	msg := err.Error()
	if i := strings.Index(msg, "SPIFFE ID mismatch"); i >= 0 {
		return msg[i:] + " (pass the server's SPIFFE ID with --tls-server-spiffe)", true
	}
	i := strings.Index(msg, "remote error: tls: ")
	if i < 0 {
		return "", false
	}
	switch alert := msg[i+len("remote error: tls: "):]; alert {
	case "bad certificate":
		return "the server refused this client's certificate (bad certificate: not allowed by its peer policy, e.g. a wrong SPIFFE ID, or invalid)", true
	case "unknown certificate authority":
		return "unknown CA: the server does not trust the CA that signed this client's certificate", true
	case "expired certificate":
		return "the server says this client's certificate has expired or is not yet valid (renew it, or check the clocks: clock skew)", true
	case "certificate required":
		return "the server requires a client certificate (mutual TLS): pass --tls-cert and --tls-key", true
	case "protocol version not supported":
		return "TLS version mismatch: udskit speaks TLS 1.3 unless configured otherwise", true
	default:
		return "the server refused the TLS connection: " + alert, true
	}
}

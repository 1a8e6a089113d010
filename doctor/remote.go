package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/udskit/udskit/uds"
)

// checkRemote diagnoses a tls: or ssh:// address: the connect (TLS
// handshake, or ssh's start), what the server's certificate says, and the
// first read, where a TLS 1.3 server refuses a client certificate and where
// ssh reports a missing remote socket. It returns the connection when all
// passed.
func checkRemote(ctx context.Context, r *Report, a uds.Addr, opts Options) net.Conn {
	if a.Kind == uds.TLS {
		inspectCert(ctx, r, a, opts.Timeout)
	}
	timeout := opts.Timeout
	if a.Kind == uds.SSH && timeout < 20*time.Second {
		timeout = 20 * time.Second // ssh: connect, host key, authentication
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := uds.Dial(dctx, a.String(), uds.DialOptions{TLS: opts.TLS, SSH: opts.SSH})
	if err != nil {
		remoteFail(r, a, err)
		return nil
	}
	// A udskit server says nothing until the client's hello, so silence
	// here is good news; a refusal or a closed remote socket is not.
	wait := 300 * time.Millisecond
	if a.Kind == uds.SSH {
		wait = time.Second
	}
	c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, rerr := c.Read(b[:])
	c.SetReadDeadline(time.Time{})
	var ne net.Error
	if rerr != nil && !(errors.As(rerr, &ne) && ne.Timeout()) {
		c.Close()
		remoteFail(r, a, rerr)
		return nil
	}
	detail := "connected to " + a.String()
	if tc, ok := c.(*tls.Conn); ok {
		st := tc.ConnectionState()
		detail += fmt.Sprintf(" (%s, %s)", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
	} else if a.Kind == uds.SSH {
		detail += " through ssh (the remote server sees the ssh login user as its peer)"
	}
	r.add("connect", Pass, "", "%s", detail)
	if rerr == nil {
		// The server spoke first: hand the byte over is not possible here;
		// a fresh connection is sniffed instead.
		c.Close()
		dctx2, cancel2 := context.WithTimeout(ctx, timeout)
		defer cancel2()
		if c, err = uds.Dial(dctx2, a.String(), uds.DialOptions{TLS: opts.TLS, SSH: opts.SSH}); err != nil {
			return nil
		}
	}
	return c
}

// remoteFail adds the connect check's failure with the reason and fix.
func remoteFail(r *Report, a uds.Addr, err error) {
	var se *uds.SSHError
	if errors.As(err, &se) {
		r.add("connect", Fail, sshFix(se.Reason, a), "%s", se.Error())
		return
	}
	cause := err.Error()
	var de *uds.DialError
	if errors.As(err, &de) {
		cause = de.Cause
	}
	if c, ok := uds.ExplainTLS(err); ok {
		cause = c
	}
	fix := ""
	switch {
	case errors.Is(err, uds.ErrNoTLSConfig):
		fix = "pass --tls-ca (the CA bundle of the server's certificate), and --tls-cert/--tls-key if the server wants a client certificate"
	case strings.Contains(cause, "unknown CA"):
		fix = "use the CA bundle that signed the server's certificate (--tls-ca); the certificate line above names its issuer"
	case strings.Contains(cause, "expired"), strings.Contains(cause, "clock skew"):
		fix = "renew the certificate; if it was just issued, compare the clocks of both hosts (timedatectl)"
	case strings.Contains(cause, "name mismatch"):
		fix = "dial the name the certificate carries, or pass --tls-server-name / --tls-server-spiffe"
	case strings.Contains(cause, "SPIFFE ID mismatch"):
		fix = "check --tls-server-spiffe against the SPIFFE ID in the certificate line above"
	case strings.Contains(cause, "client certificate"), strings.Contains(cause, "refused this client"):
		fix = "present a certificate the server's policy allows (--tls-cert/--tls-key); its log names the reason"
	case strings.Contains(cause, "plaintext udskit"):
		fix = "dial tcp:HOST:PORT, or serve with --tls-cert/--tls-key"
	case strings.Contains(cause, "connection refused"):
		fix = "start the server, or check the host and port"
	}
	r.add("connect", Fail, fix, "%s", cause)
}

func sshFix(reason string, a uds.Addr) string {
	t := a.SSH()
	port := ""
	if t.Port != "" {
		port = " -p " + t.Port
	}
	switch reason {
	case "no_ssh":
		return "install OpenSSH's client (Debian: apt install openssh-client), or name one with --ssh"
	case "host_key":
		return fmt.Sprintf("connect once with ssh%s %s and compare the fingerprint with the server's, or add it with ssh-keyscan%s %s >> ~/.ssh/known_hosts after checking it", port, t.Destination(), port, t.Host)
	case "auth":
		return "load your key into the agent (ssh-add), or set IdentityFile for this host in ~/.ssh/config; check the account may log in"
	case "connect":
		return "check the host name and port; is sshd running there? (ProxyJump in ~/.ssh/config for hosts behind a bastion)"
	case "remote_socket":
		return fmt.Sprintf("start the server on %s, or check the path: ssh%s %s ls -l %s", t.Host, port, t.Destination(), t.Path)
	case "forward_refused":
		return "set AllowStreamLocalForwarding yes in the remote sshd_config"
	}
	return "run the same ssh by hand with -v to see more"
}

// inspectCert shows what the server's certificate says, whether or not it
// verifies (the handshake here trusts nothing and sends nothing after it).
func inspectCert(ctx context.Context, r *Report, a uds.Addr, timeout time.Duration) {
	var leaf *x509.Certificate
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, // only to read the certificate
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 {
				leaf = cs.PeerCertificates[0]
			}
			return nil
		}}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: conf}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", a.Name)
	if c != nil {
		c.Close()
	}
	if leaf == nil {
		if err != nil {
			if cause, ok := uds.ExplainTLS(err); ok {
				r.add("certificate", Fail, "", "%s", cause)
				return
			}
		}
		r.add("certificate", Skip, "", "no certificate read (%v)", err)
		return
	}
	id := uds.RemoteIDOf(leaf)
	var names []string
	if id.SPIFFEID != "" {
		names = append(names, "SPIFFE ID "+id.SPIFFEID)
	}
	if len(leaf.DNSNames) > 0 {
		names = append(names, "DNS "+strings.Join(leaf.DNSNames, ","))
	}
	for _, ip := range leaf.IPAddresses {
		names = append(names, "IP "+ip.String())
	}
	desc := fmt.Sprintf("the server's certificate: subject %q, issuer %q, %s; valid %s to %s",
		leaf.Subject.String(), leaf.Issuer.String(), strings.Join(names, "; "),
		leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		r.add("certificate", Fail, "renew the server's certificate (or fix this host's clock if it is wrong)", "%s: EXPIRED (this host's clock says %s)", desc, now.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		r.add("certificate", Fail, "compare the clocks of both hosts (timedatectl): the certificate is not valid yet by this host's clock", "%s: NOT YET VALID (this host's clock says %s: clock skew?)", desc, now.UTC().Format(time.RFC3339))
	default:
		r.add("certificate", Pass, "", "%s", desc)
	}
}

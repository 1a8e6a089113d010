package uds

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/tlsfiles"
)

const (
	webID = "spiffe://prod.example/ns/app/sa/web"
	dbID  = "spiffe://prod.example/ns/app/sa/db"
)

// pki is a CA, a server certificate for 127.0.0.1/localhost with the db
// SPIFFE ID, and files in a temp dir.
type pki struct {
	dir    string
	ca     *testpki.CA
	server testpki.Files
}

func newPKI(t *testing.T) *pki {
	dir := t.TempDir()
	ca := testpki.NewCA("udskit test CA")
	srv := ca.Issue(testpki.Leaf{CommonName: "db", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: dbID})
	return &pki{dir: dir, ca: ca, server: testpki.Write(dir, "server", srv, ca.PEM)}
}

func (p *pki) client(t *testing.T, name string, l testpki.Leaf, ca *testpki.CA) *tlsfiles.Source {
	if ca == nil {
		ca = p.ca
	}
	f := testpki.Write(p.dir, name, ca.Issue(l), p.ca.PEM)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// logBuf collects a listener's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// tlsEcho listens on tls:127.0.0.1:0 with policy and echoes one line per
// connection; accepted receives each accepted conn's peer.
func tlsEcho(t *testing.T, p *pki, policy PeerPolicy) (*Listener, *logBuf, chan Peer) {
	t.Helper()
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: p.server.Cert, Key: p.server.Key, CA: p.server.CA}, tlsfiles.Options{CheckEvery: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	l, err := Listen(context.Background(), "tls:127.0.0.1:0", ListenOptions{TLS: src.ServerConfig(), PeerPolicy: policy,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	peers := make(chan Peer, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case peers <- PeerOf(c):
			default: // nobody looks at more than the first few
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l, logs, peers
}

// tlsRoundTrip dials, writes and reads back a few bytes; the error is the
// first one met, the handshake's or the first read's.
func tlsRoundTrip(addr string, conf *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, DialOptions{TLS: conf})
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

func TestTLSMutualSPIFFEAllowed(t *testing.T) {
	p := newPKI(t)
	l, _, peers := tlsEcho(t, p, AllowSPIFFE(webID))
	cli := p.client(t, "web", testpki.Leaf{CommonName: "web", SPIFFEID: webID}, nil)
	if err := tlsRoundTrip(l.UAddr().String(), cli.ClientConfig(tlsfiles.ClientOptions{ServerSPIFFEID: dbID})); err != nil {
		t.Fatal(err)
	}
	pr := <-peers
	if pr.HasCred || pr.Remote == nil || pr.Remote.SPIFFEID != webID || pr.Remote.CommonName != "web" {
		t.Fatalf("peer = %+v (remote %+v), want the web SPIFFE ID", pr, pr.Remote)
	}
	if l.UAddr().Kind != TLS || !strings.HasPrefix(l.UAddr().String(), "tls:127.0.0.1:") {
		t.Fatalf("listener address %s", l.UAddr())
	}
	// The server is also checked by DNS name and by IP.
	for _, name := range []string{"localhost", ""} {
		if err := tlsRoundTrip(l.UAddr().String(), cli.ClientConfig(tlsfiles.ClientOptions{ServerName: name})); err != nil {
			t.Fatalf("server name %q: %v", name, err)
		}
	}
}

// Each refusal happens in the handshake, before Accept returns the conn,
// and both ends get a reason that names it.
func TestTLSRefusals(t *testing.T) {
	p := newPKI(t)
	other := testpki.NewCA("another CA")
	cases := []struct {
		name      string
		leaf      testpki.Leaf
		ca        *testpki.CA
		client    string // in the client's error
		server    string // in the server's log
		noCertArg bool
	}{
		{name: "unknown CA", leaf: testpki.Leaf{CommonName: "web", SPIFFEID: webID}, ca: other,
			client: "unknown CA", server: "unknown authority"},
		{name: "expired", leaf: testpki.Leaf{CommonName: "web", SPIFFEID: webID, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)},
			client: "expired", server: "expired"},
		{name: "not yet valid (clock skew)", leaf: testpki.Leaf{CommonName: "web", SPIFFEID: webID, NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(48 * time.Hour)},
			client: "clock skew", server: "not yet valid"},
		{name: "wrong SPIFFE ID", leaf: testpki.Leaf{CommonName: "batch", SPIFFEID: "spiffe://prod.example/ns/app/sa/batch"},
			client: "peer policy", server: "SPIFFE ID spiffe://prod.example/ns/app/sa/batch not in"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, logs, peers := tlsEcho(t, p, AllowSPIFFE(webID))
			cli := p.client(t, "c", tc.leaf, tc.ca)
			err := tlsRoundTrip(l.UAddr().String(), cli.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"}))
			if err == nil {
				t.Fatal("connected")
			}
			if cause, _ := ExplainTLS(err); !strings.Contains(cause+err.Error(), tc.client) {
				t.Fatalf("client error %q (explained %q), want %q", err, cause, tc.client)
			}
			waitFor(t, func() bool { return l.Refused() == 1 })
			if !strings.Contains(logs.String(), tc.server) {
				t.Fatalf("server log %q, want %q", logs.String(), tc.server)
			}
			select {
			case pr := <-peers:
				t.Fatalf("a refused peer was accepted: %v", pr)
			default:
			}
		})
	}
}

func TestTLSPolicyWithoutClientCertRefused(t *testing.T) {
	p := newPKI(t)
	l, logs, _ := tlsEcho(t, p, AllowSPIFFE(webID))
	src, err := tlsfiles.Load(tlsfiles.Files{CA: p.server.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = tlsRoundTrip(l.UAddr().String(), src.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"}))
	if cause, _ := ExplainTLS(err); !strings.Contains(cause, "requires a client certificate") {
		t.Fatalf("err %v (%q)", err, cause)
	}
	waitFor(t, func() bool { return l.Refused() == 1 })
	if !strings.Contains(logs.String(), "certificate") {
		t.Fatalf("log %q", logs.String())
	}
}

func TestTLSClientChecksServer(t *testing.T) {
	p := newPKI(t)
	l, _, _ := tlsEcho(t, p, nil)
	other := testpki.NewCA("another CA")
	f := testpki.Write(p.dir, "o", other.Issue(testpki.Leaf{CommonName: "x"}), other.PEM)
	wrongCA, err := tlsfiles.Load(tlsfiles.Files{CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	right, err := tlsfiles.Load(tlsfiles.Files{CA: p.server.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		conf *tls.Config
		want string
	}{
		{wrongCA.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"}), "unknown CA"},
		{right.ClientConfig(tlsfiles.ClientOptions{ServerName: "db.example"}), "name mismatch"},
		{right.ClientConfig(tlsfiles.ClientOptions{ServerSPIFFEID: webID}), "SPIFFE ID mismatch"},
	} {
		err := tlsRoundTrip(l.UAddr().String(), tc.conf)
		var de *DialError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("err = %v, want a DialError saying %q", err, tc.want)
		}
	}
	// No TLS configuration: no plaintext fallback.
	if _, err := Dial(context.Background(), l.UAddr().String(), DialOptions{}); !errors.Is(err, ErrNoTLSConfig) {
		t.Fatalf("dial without TLS config: %v", err)
	}
}

// A plaintext client on a tls: port reads a TLS alert (LooksLikeTLS), and
// the server logs why it refused it.
func TestTLSPlaintextClientRefused(t *testing.T) {
	p := newPKI(t)
	l, logs, peers := tlsEcho(t, p, nil)
	c, err := net.Dial("tcp", l.UAddr().Name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("UDSK\x01\x00\x00\x00hello, plaintext"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if !LooksLikeTLS(b) {
		t.Fatalf("read %q, want a TLS alert", b)
	}
	waitFor(t, func() bool { return l.Refused() == 1 })
	if !strings.Contains(logs.String(), "does not speak TLS") {
		t.Fatalf("log %q", logs.String())
	}
	select {
	case pr := <-peers:
		t.Fatalf("accepted %v", pr)
	default:
	}
}

// One slow client that never finishes its handshake does not hold up others.
func TestTLSSlowHandshakeDoesNotBlockOthers(t *testing.T) {
	p := newPKI(t)
	l, _, _ := tlsEcho(t, p, nil)
	slow, err := net.Dial("tcp", l.UAddr().Name)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	src, _ := tlsfiles.Load(tlsfiles.Files{CA: p.server.CA}, tlsfiles.Options{})
	start := time.Now()
	if err := tlsRoundTrip(l.UAddr().String(), src.ClientConfig(tlsfiles.ClientOptions{})); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %s behind a silent client", d)
	}
}

func TestPeerPolicyAcrossLocalAndRemote(t *testing.T) {
	uid := uint32(os.Geteuid())
	policy := AnyPeer(AllowUIDs(uid).Local(), AllowSPIFFE(webID))
	// Local: this process's uid passes, another uid does not.
	if err := policy(Peer{Cred: Cred{UID: uid}, HasCred: true}); err != nil {
		t.Fatal(err)
	}
	if err := policy(Peer{Cred: Cred{UID: uid + 1}, HasCred: true}); !errors.Is(err, ErrPeerRefused) {
		t.Fatalf("other uid: %v", err)
	}
	if err := policy(Peer{}); !errors.Is(err, ErrPeerRefused) {
		t.Fatalf("anonymous: %v", err)
	}
	// The same policy on a unix listener lets this process in...
	dir := t.TempDir()
	ul, err := Listen(context.Background(), filepath.Join(dir, "s.sock"), ListenOptions{PeerPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		c, err := ul.Accept()
		if err == nil {
			c.Write([]byte(PeerOf(c).String()))
			c.Close()
		}
	}()
	c, err := Dial(context.Background(), ul.UAddr().String(), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasPrefix(string(b), "local pid=") {
		t.Fatalf("unix peer %q", b)
	}
	// ...and on a tls: listener lets the web workload in, not the batch one.
	p := newPKI(t)
	l, _, _ := tlsEcho(t, p, policy)
	web := p.client(t, "web", testpki.Leaf{SPIFFEID: webID}, nil)
	if err := tlsRoundTrip(l.UAddr().String(), web.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"})); err != nil {
		t.Fatal(err)
	}
	batch := p.client(t, "batch", testpki.Leaf{SPIFFEID: "spiffe://prod.example/ns/app/sa/batch"}, nil)
	if err := tlsRoundTrip(l.UAddr().String(), batch.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"})); err == nil {
		t.Fatal("batch got in")
	}
	// A kernel-credential Policy on tls:, or any policy on plain tcp:, is refused.
	if _, err := Listen(context.Background(), "tls:127.0.0.1:0", ListenOptions{Policy: AllowSameUser(), TLS: &tls.Config{}}); !errors.Is(err, ErrPolicyOnTCP) {
		t.Fatalf("Policy on tls: %v", err)
	}
	if _, err := Listen(context.Background(), "tcp:127.0.0.1:0", ListenOptions{PeerPolicy: policy}); !errors.Is(err, ErrPolicyOnTCP) {
		t.Fatalf("PeerPolicy on tcp: %v", err)
	}
	if _, err := Listen(context.Background(), "tls:127.0.0.1:0", ListenOptions{}); !errors.Is(err, ErrNoTLSConfig) {
		t.Fatalf("no TLS config: %v", err)
	}
}

// Ten certificate rotations (new key and certificate, atomically renamed
// into place) while clients keep connecting: no failed connection, and the
// clients see every new certificate.
func TestTLSRotationNoFailedCalls(t *testing.T) {
	p := newPKI(t)
	l, logs, _ := tlsEcho(t, p, AllowSPIFFE(webID))
	cli := p.client(t, "web", testpki.Leaf{SPIFFEID: webID}, nil)
	var seen sync.Map
	conf := cli.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"})
	conf.ClientSessionCache = nil // full handshakes: each must see the current certificate
	verify := conf.VerifyConnection
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		seen.Store(cs.PeerCertificates[0].SerialNumber.String(), true)
		return verify(cs)
	}
	stop := make(chan struct{})
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				if err := tlsRoundTrip(l.UAddr().String(), conf); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	for i := range 10 {
		time.Sleep(60 * time.Millisecond)
		leaf := p.ca.Issue(testpki.Leaf{CommonName: "db", DNSNames: []string{"localhost"}, SPIFFEID: dbID})
		testpki.Write(p.dir, "server", leaf, p.ca.PEM)
		_ = i
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	n := 0
	seen.Range(func(any, any) bool { n++; return true })
	t.Logf("%d calls, %d failed, %d server certificates seen", calls.Load(), failed.Load(), n)
	if failed.Load() != 0 {
		t.Fatalf("%d of %d calls failed; first: %v; server log:\n%s", failed.Load(), calls.Load(), firstErr.Load(), logs)
	}
	if n < 6 {
		t.Fatalf("clients saw %d server certificates over 10 rotations; reload does not work", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5s")
}

// A session resumed after the server's CA bundle changed is verified
// against the new bundle: removing a CA locks its clients out at once.
func TestTLSResumptionRecheckedAgainstCurrentCA(t *testing.T) {
	p := newPKI(t)
	l, _, _ := tlsEcho(t, p, AllowSPIFFE(webID))
	cli := p.client(t, "web", testpki.Leaf{SPIFFEID: webID}, nil)
	conf := cli.ClientConfig(tlsfiles.ClientOptions{ServerName: "localhost"})
	resumed := func() (bool, error) {
		c, err := Dial(context.Background(), l.UAddr().String(), DialOptions{TLS: conf})
		if err != nil {
			return false, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return false, err
		}
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return false, err
		}
		return c.(*tls.Conn).ConnectionState().DidResume, nil
	}
	if _, err := resumed(); err != nil {
		t.Fatal(err)
	}
	if ok, err := resumed(); err != nil || !ok {
		t.Fatalf("second connection: resumed %v, %v", ok, err)
	}
	// The server now trusts only another CA (its own certificate unchanged).
	other := testpki.NewCA("new CA")
	os.WriteFile(p.server.CA+".tmp", other.PEM, 0o644)
	os.Rename(p.server.CA+".tmp", p.server.CA)
	time.Sleep(30 * time.Millisecond)
	ok, err := resumed()
	if err == nil {
		t.Fatalf("connected (resumed %v) after the client's CA was removed", ok)
	}
	// Go itself declines to resume then (a full handshake: unknown CA), or
	// resumes and our VerifyConnection re-verifies (bad certificate).
	if cause, _ := ExplainTLS(err); !strings.Contains(cause, "refused this client's certificate") && !strings.Contains(cause, "unknown CA") {
		t.Fatalf("err %v (%q)", err, cause)
	}
}

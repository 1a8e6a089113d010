package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// Files names the PEM files. Cert and Key are required for a server and for
// a client doing mutual TLS; CA is the bundle peers are verified against
// (required for a server that verifies client certificates).
type Files struct {
	Cert, Key, CA string
}

// Options configures a Source. The zero value checks for changes at most
// once a second.
type Options struct {
	// CheckEvery is the least time between two checks of the files. Default 1s.
	CheckEvery time.Duration
	// Logger receives reload notes and failures. Default slog.Default().
	Logger *slog.Logger
}

// MaxPEMSize caps each file read: a PEM bundle larger than this is refused.
const MaxPEMSize = 4 << 20

// set is one consistent load of the files.
type set struct {
	cert  *tls.Certificate // nil without Cert/Key
	pool  *x509.CertPool   // nil without CA
	stamp [3]fileStamp
}

type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// Source holds the current certificate, key and CA bundle.
type Source struct {
	files Files
	opts  Options
	log   *slog.Logger

	mu        sync.Mutex
	cur       *set
	lastCheck time.Time
	reloads   int
}

// Load reads the files once; an error here is fatal (a bad path, a key that
// does not match its certificate, a bundle with no certificate).
func Load(f Files, opts Options) (*Source, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("tlsfiles: a certificate needs its key and a key its certificate (--tls-cert with --tls-key)")
	}
	if f.Cert == "" && f.CA == "" {
		return nil, errors.New("tlsfiles: no files: want a certificate and key, a CA bundle, or both")
	}
	if opts.CheckEvery <= 0 {
		opts.CheckEvery = time.Second
	}
	s := &Source{files: f, opts: opts, log: opts.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	cur, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur, s.lastCheck = cur, time.Now()
	return s, nil
}

func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > MaxPEMSize {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit for a PEM file", path, fi.Size(), MaxPEMSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxPEMSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxPEMSize {
		return nil, fmt.Errorf("%s grew over the %d-byte limit while reading it", path, MaxPEMSize)
	}
	return b, nil
}

func stampOf(path string) fileStamp {
	if path == "" {
		return fileStamp{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{mtime: -1}
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), uint64(sys.Ino)
	}
	return st
}

func (s *Source) stamps() [3]fileStamp {
	return [3]fileStamp{stampOf(s.files.Cert), stampOf(s.files.Key), stampOf(s.files.CA)}
}

// load reads all files into a new set.
func (s *Source) load() (*set, error) {
	n := &set{stamp: s.stamps()}
	if s.files.Cert != "" {
		cb, err := readCapped(s.files.Cert)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: certificate: %w", err)
		}
		kb, err := readCapped(s.files.Key)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: key: %w", err)
		}
		c, err := tls.X509KeyPair(cb, kb)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: %s with %s: %w", s.files.Cert, s.files.Key, err)
		}
		n.cert = &c
	}
	if s.files.CA != "" {
		b, err := readCapped(s.files.CA)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: CA bundle: %w", err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("tlsfiles: CA bundle %s holds no PEM certificate", s.files.CA)
		}
		n.pool = p
	}
	return n, nil
}

// current returns the set to use now, reloading first when a check is due
// and a file changed.
func (s *Source) current() *set {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.lastCheck) < s.opts.CheckEvery {
		return s.cur
	}
	s.lastCheck = time.Now()
	if s.stamps() == s.cur.stamp {
		return s.cur
	}
	n, err := s.load()
	if err != nil {
		// Mid-rotation (a certificate written before its key) or broken:
		// keep serving the previous set, and look again next time.
		s.log.Warn("tlsfiles: files changed but do not load; keeping the previous certificate", "err", err)
		return s.cur
	}
	s.cur = n
	s.reloads++
	s.log.Info("tlsfiles: reloaded", "cert", s.files.Cert, "ca", s.files.CA)
	return n
}

// Reloads returns how many times changed files were loaded since Load.
func (s *Source) Reloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloads
}

// Leaf returns the current certificate's leaf (nil without a certificate).
func (s *Source) Leaf() *x509.Certificate {
	c := s.current().cert
	if c == nil {
		return nil
	}
	return c.Leaf
}

// Pool returns the current CA bundle (nil without one).
func (s *Source) Pool() *x509.CertPool { return s.current().pool }

// ServerConfig returns a server configuration that serves the current
// certificate and verifies client certificates against the current CA
// bundle: when one is given (VerifyClientCertIfGiven; uds.Listen makes it
// required when a PeerPolicy is set). TLS 1.3 only.
func (s *Source) ServerConfig() *tls.Config {
	build := func(cur *set) *tls.Config {
		c := &tls.Config{MinVersion: tls.VersionTLS13, ClientCAs: cur.pool}
		if cur.cert != nil {
			c.Certificates = []tls.Certificate{*cur.cert}
		}
		if cur.pool != nil {
			c.ClientAuth = tls.VerifyClientCertIfGiven
		}
		return c
	}
	base := build(s.current())
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cur := s.current()
		if cur.cert == nil {
			return nil, errors.New("tlsfiles: no server certificate (--tls-cert, --tls-key)")
		}
		return build(cur), nil
	}
	return base
}

// ClientOptions says how a client checks the server's identity.
type ClientOptions struct {
	// ServerName is the DNS name (or IP) the server's certificate must
	// carry. Default: the host of the address dialed.
	ServerName string
	// ServerSPIFFEID, when set, is the SPIFFE ID the server's certificate
	// must carry as its URI SAN, checked instead of a DNS name.
	ServerSPIFFEID string
}

// ClientConfig returns a client configuration that presents the current
// certificate when the server asks for one (mutual TLS) and verifies the
// server against the current CA bundle (the system roots when there is
// none). TLS 1.3 only.
func (s *Source) ClientConfig(o ClientOptions) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: o.ServerName,
		// Reconnects resume with a session ticket (the server still checks
		// the client's certificate, and its expiry, on resumption).
		ClientSessionCache: tls.NewLRUClientSessionCache(64),
		// The standard verification is replaced, not skipped: the bundle
		// may change between handshakes, so VerifyConnection verifies the
		// chain against the current one, and the name or SPIFFE ID.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyServer(cs, s.current().pool, o)
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := s.current().cert; c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
	}
}

// SPIFFEMismatchError reports a server whose certificate verified but names
// another workload.
type SPIFFEMismatchError struct {
	Want string
	Got  []string
}

func (e *SPIFFEMismatchError) Error() string {
	return fmt.Sprintf("SPIFFE ID mismatch: the server's certificate has URI SANs %v, want %s", e.Got, e.Want)
}

// VerifyServer verifies a server's certificate chain from a client's
// connection state against roots (nil: the system roots) and its identity:
// o.ServerSPIFFEID when set, else the DNS name or IP cs.ServerName.
func VerifyServer(cs tls.ConnectionState, roots *x509.CertPool, o ClientOptions) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tlsfiles: the server sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if o.ServerSPIFFEID == "" {
		opts.DNSName = o.ServerName
		if opts.DNSName == "" {
			opts.DNSName = cs.ServerName
		}
		if opts.DNSName == "" {
			return errors.New("tlsfiles: no server name to verify the server's certificate against (set ClientOptions.ServerName or ServerSPIFFEID)")
		}
	}
	if _, err := leaf.Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	if o.ServerSPIFFEID != "" {
		var got []string
		for _, u := range leaf.URIs {
			got = append(got, u.String())
		}
		if len(got) != 1 || got[0] != o.ServerSPIFFEID {
			return &SPIFFEMismatchError{Want: o.ServerSPIFFEID, Got: got}
		}
	}
	return nil
}

// SystemClientConfig is ClientConfig without files: no client certificate,
// and the server verified against the system's roots.
func SystemClientConfig(o ClientOptions) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		ServerName:         o.ServerName,
		InsecureSkipVerify: true, // replaced by VerifyConnection, as in ClientConfig
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyServer(cs, nil, o)
		},
	}
}

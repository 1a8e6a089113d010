package doctor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testsshd"
	"github.com/udskit/udskit/tlsfiles"
	"github.com/udskit/udskit/uds"
)

// tlsServerWith listens on tls:127.0.0.1:0 with leaf, and accepts quietly.
func tlsServerWith(t *testing.T, dir string, ca *testpki.CA, leaf testpki.Leaf) string {
	t.Helper()
	f := testpki.Write(dir, "srv", ca.Issue(leaf), ca.PEM)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := uds.Listen(context.Background(), "tls:127.0.0.1:0", uds.ListenOptions{TLS: src.ServerConfig(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.UAddr().String()
}

func TestDoctorTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("doctor CA")
	good := testpki.Leaf{CommonName: "db", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: "spiffe://prod.example/db"}
	caFile := testpki.Write(dir, "ca", ca.Issue(testpki.Leaf{CommonName: "unused"}), ca.PEM).CA
	trust, err := tlsfiles.Load(tlsfiles.Files{CA: caFile}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expired := good
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	future := good
	future.NotBefore, future.NotAfter = time.Now().Add(2*time.Hour), time.Now().Add(48*time.Hour)
	for _, tc := range []struct {
		name      string
		leaf      testpki.Leaf
		opts      tlsfiles.ClientOptions
		noCA      bool
		connected bool
		cert      Status
		connect   string
	}{
		{name: "ok", leaf: good, connected: true, cert: Pass, connect: "TLS 1.3"},
		{name: "unknown CA", leaf: good, noCA: true, cert: Pass, connect: "unknown CA"},
		{name: "expired", leaf: expired, cert: Fail, connect: "expired"},
		{name: "clock skew", leaf: future, cert: Fail, connect: "clock skew"},
		{name: "SPIFFE mismatch", leaf: good, opts: tlsfiles.ClientOptions{ServerSPIFFEID: "spiffe://prod.example/web"}, cert: Pass, connect: "SPIFFE ID mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tlsServerWith(t, t.TempDir(), ca, tc.leaf)
			conf := trust.ClientConfig(tc.opts)
			if tc.noCA {
				conf = tlsfiles.SystemClientConfig(tc.opts)
			}
			r := Run(context.Background(), addr, Options{TLS: conf, Probe: "none"})
			cert, conn := r.Get("certificate"), r.Get("connect")
			if r.Connected != tc.connected || cert == nil || cert.Status != tc.cert || conn == nil || !strings.Contains(conn.Detail, tc.connect) {
				t.Fatalf("report: connected %v\n%+v", r.Connected, r.Checks)
			}
			if !tc.connected && conn.Fix == "" {
				t.Fatalf("no fix for %+v", conn)
			}
		})
	}
}

func TestDoctorSSH(t *testing.T) {
	sshd := testsshd.Start(t)
	path := filepath.Join(sshd.Dir, "app.sock")
	l, err := uds.Listen(context.Background(), path, uds.ListenOptions{Mode: 0o666})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	base := fmt.Sprintf("ssh://nobody@127.0.0.1:%d", sshd.Port)
	for _, tc := range []struct {
		name, addr string
		args       []string
		connected  bool
		detail     string
		fix        string
	}{
		{"ok", base + path, sshd.Args, true, "through ssh", ""},
		{"wrong key", base + path, sshd.WrongKeyArgs, false, "authentication refused", "ssh-add"},
		{"host key unknown", base + path, sshd.NoKnownHostArgs, false, "host key", "ssh-keyscan"},
		{"remote socket missing", base + path + ".gone", sshd.Args, false, "could not be opened", "ls -l"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Run(context.Background(), tc.addr, Options{SSH: uds.SSHOptions{Args: tc.args}, Probe: "none"})
			c := r.Get("connect")
			if r.Connected != tc.connected || c == nil || !strings.Contains(c.Detail, tc.detail) || !strings.Contains(c.Fix, tc.fix) {
				t.Fatalf("report: connected %v\n%+v", r.Connected, r.Checks)
			}
		})
	}
}

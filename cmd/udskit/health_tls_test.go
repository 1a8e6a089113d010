package main

import (
	"os"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testspiffe"
)

// udskit health probes a tls: server with the TLS flags udskit call has: the
// right client certificate gets "serving" (exit 0); a certificate the server's
// policy refuses, or a server certificate the probe cannot verify, is exit 1
// with the reason; TLS flags on a unix address are bad usage (2).
func TestHealthVerbTLS(t *testing.T) {
	server, web, batch := cliPKI(t)
	s := scServe(t, append([]string{"tls:127.0.0.1:0", "--allow-spiffe", cliWebID}, tlsArgs(server)...)...)

	r := scRun(t, "", append([]string{"health", s.addr, "--tls-server-spiffe", cliDBID}, tlsArgs(web)...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "serving" {
		t.Fatalf("health with the web certificate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// By the server's DNS name/IP instead of its SPIFFE ID.
	if r := scRun(t, "", append([]string{"health", s.addr}, tlsArgs(web)...)...); r.code != 0 {
		t.Fatalf("health by the address's IP: exit %d, %q", r.code, r.stderr)
	}
	if r := scRun(t, "", append([]string{"health", s.addr}, tlsArgs(batch)...)...); r.code != 1 || !strings.Contains(r.stderr, "peer policy") {
		t.Fatalf("health with a refused certificate: exit %d, stderr %q", r.code, r.stderr)
	}
	// No --tls-ca: the system roots do not know the test CA.
	if r := scRun(t, "", "health", s.addr); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("health without the CA: exit %d, stderr %q", r.code, r.stderr)
	}
	// The wrong server identity.
	if r := scRun(t, "", append([]string{"health", s.addr, "--tls-server-spiffe", cliWebID}, tlsArgs(web)...)...); r.code != 1 {
		t.Fatalf("health expecting another server ID: exit %d, stderr %q", r.code, r.stderr)
	}
	// --wait with TLS: the probe keeps its TLS configuration on every attempt.
	if r := scRun(t, "", append([]string{"health", "--wait", "--timeout", "20s", s.addr}, tlsArgs(web)...)...); r.code != 0 {
		t.Fatalf("health --wait: exit %d, %q", r.code, r.stderr)
	}
	if r := scRun(t, "", append([]string{"health", "unix:/nonexistent/x.sock"}, tlsArgs(web)...)...); r.code != 2 || !strings.Contains(r.stderr, "tls:") {
		t.Fatalf("TLS flags on a unix address: exit %d, stderr %q", r.code, r.stderr)
	}
}

// The same with certificates from a SPIFFE Workload API (--spiffe-socket).
func TestHealthVerbSPIFFE(t *testing.T) {
	dir, err := os.MkdirTemp("", "cli-spiffe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ca := testpki.NewCA("prod.example")
	dbAPI, _ := testspiffe.Start(t, dir, ca, cliDBID)
	webAPI, _ := testspiffe.Start(t, dir, ca, cliWebID)
	s := scServe(t, "tls:127.0.0.1:0", "--spiffe-socket", dbAPI, "--allow-spiffe", cliWebID)
	if r := scRun(t, "", "health", s.addr, "--spiffe-socket", webAPI, "--tls-server-spiffe", cliDBID); r.code != 0 || strings.TrimSpace(r.stdout) != "serving" {
		t.Fatalf("health over SPIFFE: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := scRun(t, "", "health", s.addr, "--spiffe-socket", webAPI); r.code != 2 || !strings.Contains(r.stderr, "--tls-server-spiffe") {
		t.Fatalf("no server ID: exit %d, %q", r.code, r.stderr)
	}
}

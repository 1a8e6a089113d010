package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testspiffe"
	"github.com/udskit/udskit/internal/testsshd"
)

const (
	cliWebID = "spiffe://prod.example/ns/app/sa/web"
	cliDBID  = "spiffe://prod.example/ns/app/sa/db"
)

// cliPKI writes a CA, a server certificate (127.0.0.1, localhost, the db
// SPIFFE ID) and web and batch client certificates into a temp dir.
func cliPKI(t *testing.T) (server, web, batch testpki.Files) {
	dir := t.TempDir()
	ca := testpki.NewCA("cli test CA")
	server = testpki.Write(dir, "server", ca.Issue(testpki.Leaf{CommonName: "db", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, SPIFFEID: cliDBID}), ca.PEM)
	web = testpki.Write(dir, "web", ca.Issue(testpki.Leaf{CommonName: "web", SPIFFEID: cliWebID}), ca.PEM)
	batch = testpki.Write(dir, "batch", ca.Issue(testpki.Leaf{CommonName: "batch", SPIFFEID: "spiffe://prod.example/ns/app/sa/batch"}), ca.PEM)
	return
}

func tlsArgs(f testpki.Files) []string {
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
}

func TestServeCallTLS(t *testing.T) {
	server, web, batch := cliPKI(t)
	s := scServe(t, append([]string{"tls:127.0.0.1:0", "--allow-spiffe", cliWebID}, tlsArgs(server)...)...)
	if !strings.HasPrefix(s.addr, "tls:127.0.0.1:") {
		t.Fatalf("serve address %q", s.addr)
	}
	r := scRun(t, "", append([]string{"call", s.addr, "whoami", "--tls-server-spiffe", cliDBID}, tlsArgs(web)...)...)
	var who struct {
		SPIFFEID string `json:"spiffe_id"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil || who.SPIFFEID != cliWebID {
		t.Fatalf("call whoami: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A workload the policy does not name: refused, with the reason on both sides.
	r = scRun(t, "", append([]string{"call", s.addr, "echo", "{}"}, tlsArgs(batch)...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "peer policy") {
		t.Fatalf("batch: exit %d, stderr %q", r.code, r.stderr)
	}
	waitLog(t, "serve", s.stderr, "not in [spiffe://prod.example/ns/app/sa/web]")
	// Plaintext on the TLS port: told to use tls:.
	r = scRun(t, "", "call", "tcp:"+strings.TrimPrefix(s.addr, "tls:"), "echo", "{}")
	if r.code != 1 || !strings.Contains(r.stderr, "the server speaks TLS") {
		t.Fatalf("plaintext: exit %d, stderr %q", r.code, r.stderr)
	}
	// Bad usage: TLS flags on a unix address, tls: without a certificate.
	if r := scRun(t, "", "serve", "tls:127.0.0.1:0"); r.code != 2 || !strings.Contains(r.stderr, "--tls-cert") {
		t.Fatalf("serve tls: without cert: exit %d, %q", r.code, r.stderr)
	}
	if r := scRun(t, "", "serve", filepath.Join(t.TempDir(), "s.sock"), "--allow-spiffe", cliWebID); r.code != 2 {
		t.Fatalf("--allow-spiffe on unix: exit %d, %q", r.code, r.stderr)
	}
}

// The supported way to expose a local socket to remote workloads: a TLS
// proxy in front of it, only for the SPIFFE IDs named.
func TestProxyTLSToUnix(t *testing.T) {
	server, web, batch := cliPKI(t)
	up := scServe(t, filepath.Join(t.TempDir(), "app.sock"), "-q")
	p := pxStart(t, 1, append([]string{"--listen", "tls:127.0.0.1:0", "--to", up.addr, "--allow-spiffe", cliWebID}, tlsArgs(server)...)...)
	addr := p.listens[0]
	if !strings.HasPrefix(addr, "tls:") {
		t.Fatalf("proxy listens on %q", addr)
	}
	r := scRun(t, "", append([]string{"call", addr, "echo", `{"through":"tls"}`}, tlsArgs(web)...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != `{"through":"tls"}` {
		t.Fatalf("call through the proxy: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	pxWaitLog(t, p, "peer="+`"remote `+cliWebID+`"`)
	r = scRun(t, "", append([]string{"call", addr, "echo", "{}"}, tlsArgs(batch)...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "peer policy") {
		t.Fatalf("batch through the proxy: exit %d, %q", r.code, r.stderr)
	}
	pxWaitLog(t, p, "TLS peer refused")
}

// udskit call reaches a remote udskit serve socket through a real sshd; the
// server sees the ssh login user (nobody) as the caller.
func TestCallSSH(t *testing.T) {
	sshd := testsshd.Start(t)
	s := scServe(t, filepath.Join(sshd.Dir, "app.sock"), "--mode", "0666", "-q")
	path := strings.TrimPrefix(s.addr, "unix:")
	var sshArgs []string
	for _, a := range sshd.Args {
		sshArgs = append(sshArgs, "--ssh-arg="+a)
	}
	addr := fmt.Sprintf("ssh://nobody@127.0.0.1:%d%s", sshd.Port, path)
	r := scRun(t, "", append([]string{"call", addr, "whoami"}, sshArgs...)...)
	var who struct {
		UID int `json:"uid"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil || who.UID != 65534 {
		t.Fatalf("call whoami over ssh: exit %d, %q, %q (want uid 65534, nobody)", r.code, r.stdout, r.stderr)
	}
	// udskit proxy puts the remote socket on a local one.
	local := filepath.Join(t.TempDir(), "remote.sock")
	scRunArgs := append([]string{"--listen", "unix:" + local, "--to", addr}, sshArgs...)
	pxStart(t, 1, scRunArgs...)
	r = scRun(t, "", "call", local, "whoami")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil || who.UID != 65534 {
		t.Fatalf("call whoami through proxy --to ssh://: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	var wrong []string
	for _, a := range sshd.WrongKeyArgs {
		wrong = append(wrong, "--ssh-arg="+a)
	}
	r = scRun(t, "", append([]string{"call", addr, "whoami"}, wrong...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "authentication refused") {
		t.Fatalf("wrong key: exit %d, %q", r.code, r.stderr)
	}
}

// The sidecar moved, with SPIFFE IDs from a Workload API (served over its
// real gRPC protocol on unix sockets) instead of certificate files.
func TestServeCallSPIFFEWorkloadAPI(t *testing.T) {
	dir, err := os.MkdirTemp("", "cli-spiffe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ca := testpki.NewCA("prod.example")
	dbAPI, _ := testspiffe.Start(t, dir, ca, cliDBID)
	webAPI, _ := testspiffe.Start(t, dir, ca, cliWebID)
	batchAPI, _ := testspiffe.Start(t, dir, ca, "spiffe://prod.example/ns/app/sa/batch")
	s := scServe(t, "tls:127.0.0.1:0", "--spiffe-socket", dbAPI, "--allow-spiffe", cliWebID)
	r := scRun(t, "", "call", s.addr, "whoami", "--spiffe-socket", webAPI, "--tls-server-spiffe", cliDBID)
	var who struct {
		SPIFFEID string `json:"spiffe_id"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil || who.SPIFFEID != cliWebID {
		t.Fatalf("call whoami: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := scRun(t, "", "call", s.addr, "whoami", "--spiffe-socket", batchAPI, "--tls-server-spiffe", cliDBID); r.code != 1 || !strings.Contains(r.stderr, "peer policy") {
		t.Fatalf("batch: exit %d, %q", r.code, r.stderr)
	}
	if r := scRun(t, "", "call", s.addr, "whoami", "--spiffe-socket", webAPI); r.code != 2 || !strings.Contains(r.stderr, "--tls-server-spiffe") {
		t.Fatalf("no server ID: exit %d, %q", r.code, r.stderr)
	}
}

// --spiffe-federate: a server of prod.example admits a workload of the
// federated partner.example (its bundle from the Workload API); without the
// flag the same workload is refused.
func TestServeCallSPIFFEFederated(t *testing.T) {
	dir, err := os.MkdirTemp("", "cli-spiffefed")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	prod, partner := testpki.NewCA("prod.example"), testpki.NewCA("partner.example")
	const partnerWeb = "spiffe://partner.example/ns/app/sa/pweb"
	dbAPI, db := testspiffe.Start(t, dir, prod, cliDBID)
	db.Federate("spiffe://partner.example", partner)
	pwebAPI, pweb := testspiffe.Start(t, dir, partner, partnerWeb)
	pweb.Federate("spiffe://prod.example", prod)
	call := func(addr string) scResult {
		return scRun(t, "", "call", addr, "whoami", "--spiffe-socket", pwebAPI, "--tls-server-spiffe", cliDBID)
	}
	fed := scServe(t, "tls:127.0.0.1:0", "--spiffe-socket", dbAPI, "--spiffe-federate", "partner.example", "--allow-spiffe", "spiffe://partner.example/*")
	var who struct {
		SPIFFEID string `json:"spiffe_id"`
	}
	if r := call(fed.addr); r.code != 0 || json.Unmarshal([]byte(r.stdout), &who) != nil || who.SPIFFEID != partnerWeb {
		t.Fatalf("federated: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	alone := scServe(t, "tls:127.0.0.1:0", "--spiffe-socket", dbAPI, "--allow-spiffe", "spiffe://partner.example/*")
	if r := call(alone.addr); r.code != 1 {
		t.Fatalf("not federated: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := scRun(t, "", "serve", "tls:127.0.0.1:0", "--tls-cert", "x", "--tls-key", "y", "--spiffe-federate", "partner.example"); r.code != 2 || !strings.Contains(r.stderr, "needs --spiffe-socket") {
		t.Fatalf("--spiffe-federate without --spiffe-socket: exit %d, %q", r.code, r.stderr)
	}
}

package spiffetls

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testspiffe"
	"github.com/udskit/udskit/uds"
)

// Federation over the Workload API: a server of prod.example that federates
// with partner.example admits partner.example's workload (verified against
// partner.example's bundle, its SPIFFE ID seen by the PeerPolicy), and that
// client verifies the server against prod.example's bundle; without the
// federation the partner is refused; and partner.example's CA cannot vouch
// for a prod.example ID even when federated.
func TestFederatedTrustDomains(t *testing.T) {
	dir, err := os.MkdirTemp("", "spiffefed")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	prod, partner := testpki.NewCA("prod.example"), testpki.NewCA("partner.example")
	const (
		partnerWeb = "spiffe://partner.example/ns/app/sa/pweb"
		forgedWeb  = "spiffe://prod.example/ns/app/sa/forged" // issued by partner's CA
	)
	dbAddr, dbAPI := testspiffe.Start(t, dir, prod, dbID)
	dbAPI.Federate("spiffe://partner.example", partner)
	pwebAddr, pwebAPI := testspiffe.Start(t, dir, partner, partnerWeb)
	pwebAPI.Federate("spiffe://prod.example", prod)
	forgedAddr, forgedAPI := testspiffe.Start(t, dir, partner, forgedWeb)
	forgedAPI.Federate("spiffe://prod.example", prod)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dbSrc, err := NewSource(ctx, dbAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer dbSrc.Close()
	serve := func(federatesWith ...string) string {
		sconf, err := ServerConfig(dbSrc, federatesWith...)
		if err != nil {
			t.Fatal(err)
		}
		policy := uds.AllowSPIFFE("spiffe://partner.example/*", "spiffe://prod.example/*")
		l, err := uds.Listen(ctx, "tls:127.0.0.1:0", uds.ListenOptions{TLS: sconf, PeerPolicy: policy,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					io.WriteString(c, uds.PeerOf(c).String())
				}()
			}
		}()
		return l.UAddr().String()
	}
	dial := func(server, clientAPI string) (string, error) {
		src, err := NewSource(ctx, clientAPI)
		if err != nil {
			return "", err
		}
		defer src.Close()
		cconf, err := ClientConfig(src, dbID)
		if err != nil {
			return "", err
		}
		c, err := uds.Dial(ctx, server, uds.DialOptions{TLS: cconf})
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err
	}

	federated := serve("partner.example")
	if got, err := dial(federated, pwebAddr); err != nil || got != "remote "+partnerWeb {
		t.Fatalf("partner workload on a federated server: %q, %v", got, err)
	}
	if got, err := dial(federated, forgedAddr); err == nil {
		t.Fatalf("a prod.example ID issued by partner.example's CA got in: %q", got)
	}
	alone := serve()
	if got, err := dial(alone, pwebAddr); err == nil {
		t.Fatalf("partner workload on a server that does not federate got in: %q", got)
	}
	if _, err := ServerConfig(dbSrc, "not a trust domain!"); err == nil || !strings.Contains(err.Error(), "federated trust domain") {
		t.Fatalf("bad trust domain name: %v", err)
	}
}

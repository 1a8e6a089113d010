package spiffetls

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
	"github.com/udskit/udskit/internal/testspiffe"
	"github.com/udskit/udskit/uds"
)

const (
	webID = "spiffe://prod.example/ns/app/sa/web"
	dbID  = "spiffe://prod.example/ns/app/sa/db"
)

func TestWorkloadAPIMutualTLS(t *testing.T) {
	dir, err := os.MkdirTemp("", "spiffetls")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ca := testpki.NewCA("prod.example")
	dbAddr, dbAPI := testspiffe.Start(t, dir, ca, dbID)
	webAddr, _ := testspiffe.Start(t, dir, ca, webID)
	batchAddr, _ := testspiffe.Start(t, dir, ca, "spiffe://prod.example/ns/app/sa/batch")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	dbSrc, err := NewSource(ctx, dbAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer dbSrc.Close()
	sconf, err := ServerConfig(dbSrc)
	if err != nil {
		t.Fatal(err)
	}
	l, err := uds.Listen(ctx, "tls:127.0.0.1:0", uds.ListenOptions{TLS: sconf, PeerPolicy: uds.AllowSPIFFE(webID),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
			go func() {
				defer c.Close()
				io.WriteString(c, uds.PeerOf(c).String()+"|"+dbSrcSerial(dbSrc))
			}()
		}
	}()

	dial := func(addr, serverID string) (string, error) {
		src, err := NewSource(ctx, addr)
		if err != nil {
			return "", err
		}
		defer src.Close()
		cconf, err := ClientConfig(src, serverID)
		if err != nil {
			return "", err
		}
		c, err := uds.Dial(ctx, l.UAddr().String(), uds.DialOptions{TLS: cconf})
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err
	}
	got, err := dial(webAddr, dbID)
	if err != nil || !strings.HasPrefix(got, "remote "+webID+"|") {
		t.Fatalf("web: %q, %v", got, err)
	}
	first := strings.SplitN(got, "|", 2)[1]
	if _, err := dial(batchAddr, dbID); err == nil {
		t.Fatal("batch got in")
	}
	if _, err := dial(webAddr, "spiffe://prod.example/ns/app/sa/other"); err == nil || !strings.Contains(err.Error(), "SPIFFE ID mismatch") {
		t.Fatalf("wrong server ID: %v", err)
	}
	// The agent rotates the server's SVID: the next handshake serves it.
	dbAPI.Rotate()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := dial(webAddr, dbID)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.SplitN(got, "|", 2)[1]; s != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the rotated SVID was not served within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dbSrcSerial is the serial of the SVID the source holds now.
func dbSrcSerial(src Source) string {
	s, err := src.GetX509SVID()
	if err != nil {
		return "none"
	}
	return s.Certificates[0].SerialNumber.String()
}

func TestNoWorkloadAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := NewSource(ctx, "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "Workload API unix://") {
		t.Fatalf("err = %v, want one naming the Workload API address", err)
	}
}

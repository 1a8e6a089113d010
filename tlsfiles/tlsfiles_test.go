package tlsfiles

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testpki"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	f := testpki.Write(dir, "a", ca.Issue(testpki.Leaf{CommonName: "a"}), ca.PEM)
	g := testpki.Write(dir, "b", ca.Issue(testpki.Leaf{CommonName: "b"}), ca.PEM)
	big := filepath.Join(dir, "big.pem")
	os.WriteFile(big, make([]byte, MaxPEMSize+1), 0o600)
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not PEM"), 0o600)
	for _, tc := range []struct {
		files Files
		want  string
	}{
		{Files{Cert: f.Cert}, "needs its key"},
		{Files{}, "no files"},
		{Files{Cert: f.Cert, Key: g.Key}, "private key does not match"},
		{Files{Cert: f.Cert, Key: f.Key, CA: big}, "over the"},
		{Files{CA: junk}, "no PEM certificate"},
		{Files{CA: dir}, "not a regular file"},
		{Files{Cert: filepath.Join(dir, "missing.pem"), Key: f.Key}, "no such file"},
	} {
		if _, err := Load(tc.files, Options{Logger: quiet}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.files, err, tc.want)
		}
	}
}

// A half-written rotation (a new certificate with the old key) is not
// loaded: the previous pair keeps serving until the key catches up.
func TestReloadKeepsPreviousUntilConsistent(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("ca")
	first := ca.Issue(testpki.Leaf{CommonName: "first"})
	f := testpki.Write(dir, "s", first, ca.PEM)
	src, err := Load(Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, Options{CheckEvery: time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	second := ca.Issue(testpki.Leaf{CommonName: "second"})
	os.WriteFile(f.Cert, second.CertPEM, 0o644) // the key is still the first's
	time.Sleep(5 * time.Millisecond)
	if cn := src.Leaf().Subject.CommonName; cn != "first" || src.Reloads() != 0 {
		t.Fatalf("after a half rotation: serving %q, %d reloads", cn, src.Reloads())
	}
	os.WriteFile(f.Key, second.KeyPEM, 0o600)
	time.Sleep(5 * time.Millisecond)
	if cn := src.Leaf().Subject.CommonName; cn != "second" || src.Reloads() != 1 {
		t.Fatalf("after the key: serving %q, %d reloads", cn, src.Reloads())
	}
	// Files that vanish keep the current set too.
	os.Remove(f.Cert)
	time.Sleep(5 * time.Millisecond)
	if cn := src.Leaf().Subject.CommonName; cn != "second" {
		t.Fatalf("after removal: serving %q", cn)
	}
}

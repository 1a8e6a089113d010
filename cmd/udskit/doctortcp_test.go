package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
)

// TestDoctorFindsPostgresOnTCP is the Rails developer's case (issue 27): a
// PostgreSQL that listens only on 127.0.0.1:PORT, an app that insists on
// DIR/.s.PGSQL.PORT. The doctor finds the server on TCP and prints the exact
// proxy command; that command, run as printed, lets psql (also as another
// user) in through the socket.
func TestDoctorFindsPostgresOnTCP(t *testing.T) {
	pg := testsvc.StartPostgres(t, testsvc.PostgresOptions{TCP: true})
	dir := testutil.ShortDir(t, 0o755)
	sock := filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(pg.Port))

	out, err := runCLI(t, "doctor", sock)
	if err == nil {
		t.Fatalf("doctor passed with no socket:\n%s", out)
	}
	if strings.Contains(out, "start PostgreSQL") {
		t.Errorf("doctor says to start a PostgreSQL that runs:\n%s", out)
	}
	if !strings.Contains(out, "listens on TCP 127.0.0.1:"+strconv.Itoa(pg.Port)) {
		t.Errorf("doctor does not say where PostgreSQL listens:\n%s", out)
	}
	// The text output wraps long lines: join them before matching the command.
	flat := strings.Join(strings.Fields(out), " ")
	want := "udskit proxy --listen " + sock + " --mode 0666 --to tcp:127.0.0.1:" + strconv.Itoa(pg.Port)
	m := regexp.MustCompile(`udskit proxy (--listen \S+ --mode \S+ --to tcp:[0-9.]+:[0-9]+)`).FindStringSubmatch(flat)
	if m == nil || "udskit proxy "+m[1] != want {
		t.Fatalf("doctor's fix: want %q in:\n%s", want, out)
	}

	// Run the printed command; psql then reaches PostgreSQL through the socket.
	pxStart(t, 1, strings.Fields(m[1])...)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("proxy socket: %v %v", fi, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	psql := testsvc.Psql(ctx, dir, pg.Port, "-c", "select 40+2")
	if b, err := psql.CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "42" {
		t.Fatalf("psql through the proxy: %v\n%s", err, b)
	}
	if os.Geteuid() == 0 {
		// As another user (the app may not run as the proxy's owner): 0666 lets it in.
		args := append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", "psql"}, testsvc.Psql(ctx, dir, pg.Port, "-c", "select 1").Args[1:]...)
		c := exec.CommandContext(ctx, "setpriv", args...)
		c.Env = append(os.Environ(), "PSQLRC=/dev/null", "HOME=/")
		if b, err := c.CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Fatalf("psql as nobody through the proxy: %v\n%s", err, b)
		}
	}
	// And now the doctor passes on that socket.
	if out, err := runCLI(t, "doctor", sock); err != nil || !strings.Contains(out, "PostgreSQL") {
		t.Fatalf("doctor through the proxy: %v\n%s", err, out)
	}
}

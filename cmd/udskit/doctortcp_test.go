package main

import (
	"context"
	"net"
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

// TestDoctorThroughProxyUpstreamDown: connecting to a udskit proxy always
// works; the doctor reads the proxy's route and checks the upstream too, so
// a dead upstream is a failure that names it, and a live one passes.
func TestDoctorThroughProxyUpstreamDown(t *testing.T) {
	port := testsvc.FreePort(t)
	up := "tcp:127.0.0.1:" + strconv.Itoa(port)
	sock := filepath.Join(testutil.ShortDir(t, 0o700), "pg.sock")
	pxStart(t, 1, "--listen", sock, "--to", up)
	out, err := runCLI(t, "doctor", "--probe", "none", sock)
	flat := strings.Join(strings.Fields(out), " ")
	if err == nil || !strings.Contains(flat, "FAIL upstream") || !strings.Contains(flat, "relaying to "+up) || !strings.Contains(flat, "does not answer") {
		t.Fatalf("upstream down: want a failed upstream check naming %s (err %v):\n%s", up, err, out)
	}
	l, lerr := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if lerr != nil {
		t.Fatal(lerr)
	}
	defer l.Close()
	out, err = runCLI(t, "doctor", "--probe", "none", sock)
	if err != nil || !strings.Contains(strings.Join(strings.Fields(out), " "), "PASS upstream") {
		t.Fatalf("upstream up: %v\n%s", err, out)
	}
}

// TestDoctorAfterKilledCapture: a capture killed while interposed on a Redis
// socket leaves its relay at the path and Redis under the aside name. The
// doctor says so and says to restore, not to rm the path, and finds Redis
// live under the aside name; the restore it names works.
func TestDoctorAfterKilledCapture(t *testing.T) {
	testsvc.NeedBinary(t, "redis-cli")
	r := testsvc.StartRedis(t, testsvc.RedisOptions{})
	c := startCapture(t, nil, r.Socket, "-w", filepath.Join(t.TempDir(), "x.pcapng"))
	c.cmd.Process.Kill()
	<-c.done
	c.done <- nil // for the Cleanup
	out, _ := runCLI(t, "doctor", r.Socket)
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"FAIL capture", "was killed", "udskit capture --restore " + r.Socket, "Redis is live, set aside by a udskit capture"} {
		if !strings.Contains(flat, want) {
			t.Errorf("doctor does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(flat, "rm "+r.Socket+" ") || strings.HasSuffix(flat, "rm "+r.Socket) || strings.Contains(flat, "no live Redis") {
		t.Errorf("doctor advises rm or says no Redis is live:\n%s", out)
	}
	if res := scRun(t, "", "capture", "--restore", r.Socket); res.code != 0 {
		t.Fatalf("restore: %+v", res)
	}
	if out, err := runCLI(t, "doctor", r.Socket); err != nil || strings.Contains(out, "FAIL") {
		t.Fatalf("after the restore: %v\n%s", err, out)
	}
}

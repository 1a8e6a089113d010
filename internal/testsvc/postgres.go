package testsvc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PostgresOptions chooses where a test PostgreSQL listens. The zero value is a
// unix socket only (listen_addresses set to empty), the case most tests want.
type PostgresOptions struct {
	// TCP listens on 127.0.0.1 on a free port instead of a unix socket
	// (unix_socket_directories=''), so only TCP reaches the server.
	TCP bool
	// Port is the port number: the TCP port, or the number in the socket's
	// name .s.PGSQL.PORT. Default: a free port (TCP) or 5432 (unix).
	Port int
}

// Postgres is a running test PostgreSQL server with trust auth for user
// "postgres", stopped in t.Cleanup.
type Postgres struct {
	// Dir is the server's temp dir; the socket lives here in unix mode.
	Dir string
	// DataDir is the cluster's data directory (inside Dir).
	DataDir string
	// Host is what to give psql -h: Dir (unix) or "127.0.0.1" (TCP).
	Host string
	// Port is the TCP port or the socket's port number.
	Port int
	// User is the database superuser, "postgres".
	User string
	// Bin is the directory holding initdb/postgres.
	Bin string
	// RunAs is the OS user the server runs as (nil when the test is not root).
	RunAs *Owner
}

// PostgresBin returns the newest /usr/lib/postgresql/*/bin with an initdb in
// it, or looks on PATH; "" when none is installed.
func PostgresBin() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVer(dirs[i]) < pgVer(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

func pgVer(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// serverUser picks who runs a server that refuses root: nil when not root,
// else the "postgres" system user, else nobody/nogroup.
func serverUser() (*Owner, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &Owner{Name: name, UID: uid, GID: gid}, nil
	}
	return nil, fmt.Errorf("running as root and neither a postgres nor a nobody user exists")
}

// asUser builds a command that runs name as o (via setpriv) or as ourselves.
func asUser(o *Owner, name string, args ...string) *exec.Cmd {
	if o == nil {
		return exec.Command(name, args...)
	}
	pre := []string{"--reuid=" + itoa(o.UID), "--regid=" + itoa(o.GID), "--clear-groups", "--pdeathsig=SIGKILL", "--", name}
	return exec.Command("setpriv", append(pre, args...)...)
}

// StartPostgres runs initdb in a fresh temp dir and starts postgres on it.
// It skips the test when PostgreSQL or psql is not installed.
func StartPostgres(t testing.TB, opts PostgresOptions) *Postgres {
	t.Helper()
	bin := PostgresBin()
	if bin == "" {
		t.Skip("PostgreSQL server binaries (initdb, postgres) are not installed (run scripts/install-deps.sh)")
	}
	NeedBinary(t, "psql")
	runAs, err := serverUser()
	if err != nil {
		t.Skipf("cannot run PostgreSQL here: %v", err)
	}
	if runAs != nil {
		NeedBinary(t, "setpriv")
	}
	dir := TempDir(t, runAs)
	p := &Postgres{Dir: dir, DataDir: filepath.Join(dir, "data"), User: "postgres", Bin: bin, RunAs: runAs, Port: opts.Port}

	initdb := asUser(runAs, filepath.Join(bin, "initdb"), "-D", p.DataDir, "-U", p.User,
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	ctx, cancel := context.WithTimeout(context.Background(), 2*StartTimeout)
	defer cancel()
	initdb = withContext(ctx, initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testsvc: initdb: %v\n%s", err, out)
	}

	args := []string{"-D", p.DataDir, "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=40", "-c", "shared_buffers=16MB"}
	if opts.TCP {
		if p.Port == 0 {
			p.Port = FreePort(t)
		}
		p.Host = "127.0.0.1"
		args = append(args, "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=")
	} else {
		if p.Port == 0 {
			p.Port = 5432
		}
		p.Host = dir
		args = append(args, "-c", "listen_addresses=", "-c", "unix_socket_directories="+dir)
	}
	args = append(args, "-p", itoa(p.Port))
	cmd := asUser(runAs, filepath.Join(bin, "postgres"), args...)
	cmd.Dir = dir
	proc := start(t, cmd)
	// SIGINT is PostgreSQL's "fast" shutdown: disconnect clients, stop.
	t.Cleanup(func() { proc.stop(syscall.SIGINT, 10*time.Second) })

	isready := filepath.Join(bin, "pg_isready")
	waitReady(t, "postgres", proc, func() error {
		_, err := runCmd(context.Background(), 5*time.Second, isready, "-q", "-h", p.Host, "-p", itoa(p.Port), "-U", p.User, "-t", "2")
		return err
	})
	return p
}

// SocketPath is the server's unix socket, Dir/.s.PGSQL.PORT (unix mode only).
func (p *Postgres) SocketPath() string {
	return filepath.Join(p.Dir, ".s.PGSQL."+itoa(p.Port))
}

// Psql returns a psql command against host/port (use p.Host/p.Port for the
// server itself, or a proxy's), quiet, unaligned, stopping on the first error.
func Psql(ctx context.Context, host string, port int, args ...string) *exec.Cmd {
	base := []string{"-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", itoa(port), "-U", "postgres", "-d", "postgres"}
	cmd := exec.CommandContext(ctx, "psql", append(base, args...)...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGPASSWORD=", "PSQLRC=/dev/null")
	return cmd
}

// Query runs sql through psql on the server itself and returns trimmed output.
func (p *Postgres) Query(t testing.TB, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := Psql(ctx, p.Host, p.Port, "-c", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -h %s -p %d -c %q: %v\n%s", p.Host, p.Port, sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

func withContext(ctx context.Context, c *exec.Cmd) *exec.Cmd {
	n := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
	n.Dir, n.Env, n.SysProcAttr = c.Dir, c.Env, c.SysProcAttr
	return n
}

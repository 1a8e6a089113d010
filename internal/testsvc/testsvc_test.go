package testsvc

import (
	"os"
	"testing"
)

func TestPostgresUnixOnly(t *testing.T) {
	pg := StartPostgres(t, PostgresOptions{})
	if got := pg.Query(t, "select 40 + 2"); got != "42" {
		t.Fatalf("select 40 + 2 = %q", got)
	}
	fi, err := os.Stat(pg.SocketPath())
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v %v", pg.SocketPath(), fi, err)
	}
}

func TestPostgresTCPOnly(t *testing.T) {
	pg := StartPostgres(t, PostgresOptions{TCP: true})
	if got := pg.Query(t, "show listen_addresses"); got != "127.0.0.1" {
		t.Fatalf("listen_addresses = %q", got)
	}
	if _, err := os.Stat(pg.SocketPath()); err == nil {
		t.Fatalf("TCP-only server made a unix socket %s", pg.SocketPath())
	}
}

func TestRedis(t *testing.T) {
	r := StartRedis(t, RedisOptions{})
	if err := redisPing(r.Socket); err != nil {
		t.Fatal(err)
	}
}

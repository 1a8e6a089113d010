package testsvc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisOptions chooses where a test Redis listens. The zero value is a unix
// socket only (--port 0), no persistence.
type RedisOptions struct {
	// TCP also listens on 127.0.0.1 on a free port.
	TCP bool
}

// Redis is a running test redis-server, stopped in t.Cleanup.
type Redis struct {
	Dir    string // its temp dir (working dir, socket)
	Socket string // unix socket path
	Port   int    // TCP port on 127.0.0.1, 0 when not listening on TCP
}

// StartRedis starts redis-server on a unix socket in a temp dir (and on a
// loopback port if asked). It skips the test when redis-server is absent.
func StartRedis(t testing.TB, opts RedisOptions) *Redis {
	t.Helper()
	bin := NeedBinary(t, "redis-server")
	dir := TempDir(t, nil)
	r := &Redis{Dir: dir, Socket: filepath.Join(dir, "redis.sock")}
	port := 0
	if opts.TCP {
		port = FreePort(t)
		r.Port = port
	}
	args := []string{"--port", itoa(port), "--bind", "127.0.0.1", "--unixsocket", r.Socket,
		"--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--loglevel", "warning"}
	proc := start(t, execCommand(bin, args...))
	t.Cleanup(func() { proc.stop(syscall.SIGTERM, 10*time.Second) })
	waitReady(t, "redis-server", proc, func() error { return redisPing(r.Socket) })
	return r
}

// redisPing sends PING over the unix socket and expects +PONG.
func redisPing(sock string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

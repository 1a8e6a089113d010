package uds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsshd"
)

// credServer listens on a unix socket any user may connect to and answers
// each connection with the peer's uid.
func credServer(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "app.sock")
	l, err := Listen(context.Background(), path, ListenOptions{Mode: 0o666})
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
			cr, _ := CredOf(c)
			fmt.Fprintf(c, "uid=%d", cr.UID)
			c.Close()
		}
	}()
	return path
}

func TestSSHDialReachesRemoteSocket(t *testing.T) {
	sshd := testsshd.Start(t)
	path := credServer(t, sshd.Dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		user string
		uid  int
	}{{"root", 0}, {"nobody", 65534}} {
		if tc.uid == 0 && os.Geteuid() != 0 {
			continue
		}
		addr := fmt.Sprintf("ssh://%s@127.0.0.1:%d%s", tc.user, sshd.Port, path)
		c, err := Dial(ctx, addr, DialOptions{SSH: SSHOptions{Args: sshd.Args}})
		if err != nil {
			t.Fatalf("%s: %v\nsshd: %s", addr, err, sshd.Log())
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(b) != fmt.Sprintf("uid=%d", tc.uid) {
			t.Fatalf("%s: read %q, %v; want the ssh user's uid %d", addr, b, err, tc.uid)
		}
	}
}

func TestSSHDialFailuresSayWhy(t *testing.T) {
	sshd := testsshd.Start(t)
	path := credServer(t, sshd.Dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := fmt.Sprintf("ssh://nobody@127.0.0.1:%d", sshd.Port)
	for _, tc := range []struct {
		name, addr string
		opts       SSHOptions
		reason     string
		says       string
	}{
		{"wrong key", addr + path, SSHOptions{Args: sshd.WrongKeyArgs}, "auth", "authentication refused"},
		{"host key unknown", addr + path, SSHOptions{Args: sshd.NoKnownHostArgs}, "host_key", "known_hosts"},
		{"no ssh binary", addr + path, SSHOptions{Binary: "udskit-no-such-ssh"}, "no_ssh", "install OpenSSH"},
		{"nothing on the port", "ssh://nobody@127.0.0.1:1" + path, SSHOptions{Args: sshd.Args}, "connect", "no ssh server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Dial(ctx, tc.addr, DialOptions{SSH: tc.opts})
			var se *SSHError
			if !errors.As(err, &se) || se.Reason != tc.reason || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err = %v, want reason %s saying %q", err, tc.reason, tc.says)
			}
		})
	}
	t.Run("remote socket missing", func(t *testing.T) {
		c, err := Dial(ctx, addr+filepath.Join(sshd.Dir, "missing.sock"), DialOptions{SSH: SSHOptions{Args: sshd.Args}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
		var se *SSHError
		if !errors.As(err, &se) || se.Reason != "remote_socket" || !errors.Is(err, io.EOF) {
			t.Fatalf("read err = %v, want a remote_socket SSHError that is io.EOF", err)
		}
	})
}

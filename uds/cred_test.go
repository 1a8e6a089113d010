package uds

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

func TestPeerCredSelf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l := listenT(t, path, ListenOptions{})
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			got <- c
		}
	}()
	c, err := Dial(context.Background(), path, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := <-got
	defer sc.Close()
	want := Cred{PID: int32(os.Getpid()), UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	for name, conn := range map[string]net.Conn{"server side": sc, "client side": c} {
		cr, err := PeerCred(conn)
		if err != nil || cr != want {
			t.Errorf("%s: PeerCred = %v, %v; want %v", name, cr, err, want)
		}
	}
	if cr, ok := CredOf(sc); !ok || cr != want {
		t.Errorf("CredOf = %v %v", cr, ok)
	}
	if cr, ok := sc.(*Conn).Cred(); !ok || cr != want {
		t.Errorf("Conn.Cred = %v %v", cr, ok)
	}
	if !strings.Contains(want.String(), "pid=") {
		t.Error(want.String())
	}
}

func TestPeerCredChildProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l := listenT(t, path, ListenOptions{})
	cmd := testutil.HelperCmd(t, "dial", path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	l.Listener.(*net.UnixListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cr, err := PeerCred(c)
	if err != nil {
		t.Fatal(err)
	}
	if int(cr.PID) != cmd.Process.Pid || cr.PID == int32(os.Getpid()) {
		t.Fatalf("PeerCred pid %d, want child's %d", cr.PID, cmd.Process.Pid)
	}
	if cr.UID != uint32(os.Getuid()) {
		t.Fatalf("uid %d", cr.UID)
	}
}

func TestPeerCredTCP(t *testing.T) {
	l := listenT(t, "tcp:127.0.0.1:0", ListenOptions{})
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := Dial(context.Background(), l.UAddr().String(), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := PeerCred(c); !errors.Is(err, ErrNoCred) {
		t.Fatalf("TCP PeerCred: %v", err)
	}
}

func TestPolicyHelpers(t *testing.T) {
	root := Cred{PID: 1, UID: 0, GID: 0}
	user := Cred{PID: 2, UID: 1000, GID: 100}
	cases := []struct {
		name  string
		p     Policy
		allow []Cred
		deny  []Cred
	}{
		{"AllowUIDs", AllowUIDs(1000, 1001), []Cred{user}, []Cred{root}},
		{"AllowGIDs", AllowGIDs(100), []Cred{user}, []Cred{root}},
		{"AllowRoot", AllowRoot(), []Cred{root}, []Cred{user}},
		{"AllowSameUser", AllowSameUser(), []Cred{{UID: uint32(os.Geteuid())}}, []Cred{{UID: uint32(os.Geteuid()) + 1}}},
		{"AnyOf", AnyOf(AllowRoot(), AllowGIDs(100)), []Cred{root, user}, []Cred{{UID: 5, GID: 5}}},
		{"AnyOf empty", AnyOf(), nil, []Cred{root}},
		{"AllOf", AllOf(AllowUIDs(1000), AllowGIDs(100)), []Cred{user}, []Cred{{UID: 1000, GID: 1}, root}},
	}
	for _, tc := range cases {
		for _, c := range tc.allow {
			if err := tc.p(c); err != nil {
				t.Errorf("%s should allow %v: %v", tc.name, c, err)
			}
		}
		for _, c := range tc.deny {
			if err := tc.p(c); !errors.Is(err, ErrPeerRefused) {
				t.Errorf("%s should refuse %v with ErrPeerRefused: %v", tc.name, c, err)
			}
		}
	}
}

package testsshd

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// SSHD is a running sshd.
type SSHD struct {
	Dir  string // world-readable temp dir (0755) holding keys and config
	Port int
	// Args are the ssh client arguments for it: its key, known_hosts, no
	// agent, no user config.
	Args []string
	// WrongKeyArgs are Args with a key the server does not accept.
	WrongKeyArgs []string
	// NoKnownHostArgs are Args with an empty known_hosts.
	NoKnownHostArgs []string
	log             *syncBuf
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) { b.mu.Lock(); defer b.mu.Unlock(); return b.b.Write(p) }
func (b *syncBuf) String() string              { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// Log returns what sshd logged so far.
func (s *SSHD) Log() string { return s.log.String() }

func keygen(t testing.TB, path string) {
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "udskit-test", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
}

// Start runs sshd until the test ends. Users may log in with the
// generated key as any account sshd accepts (root, or nobody for a non-root
// uid: its shell is never run, the tests only forward).
func Start(t testing.TB) *SSHD {
	t.Helper()
	const sshd = "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		t.Fatalf("%s missing: run scripts/install-deps.sh (openssh-server)", sshd)
	}
	if os.Geteuid() == 0 {
		// sshd's privilege separation directory; systemd-tmpfiles makes it at boot.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "udskit-sshd-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // authorized_keys is read as the login user
	t.Cleanup(func() { os.RemoveAll(dir) })
	hostKey, userKey, wrongKey := filepath.Join(dir, "host_key"), filepath.Join(dir, "user_key"), filepath.Join(dir, "wrong_key")
	keygen(t, hostKey)
	keygen(t, userKey)
	keygen(t, wrongKey)
	pub, err := os.ReadFile(userKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	authorized := filepath.Join(dir, "authorized_keys")
	os.WriteFile(authorized, pub, 0o644)
	// A free port: listen on :0, close, hand it to sshd (retried below if taken).
	var s *SSHD
	for attempt := 0; attempt < 5 && s == nil; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		conf := filepath.Join(dir, "sshd_config")
		os.WriteFile(conf, []byte(strings.Join([]string{
			fmt.Sprintf("ListenAddress 127.0.0.1:%d", port),
			"HostKey " + hostKey,
			"AuthorizedKeysFile " + authorized,
			"PidFile none",
			"StrictModes no",
			"UsePAM no",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"PermitRootLogin prohibit-password",
			"AllowStreamLocalForwarding yes",
			"LogLevel VERBOSE",
			"",
		}, "\n")), 0o644)
		cmd := exec.Command(sshd, "-D", "-e", "-f", conf)
		log := &syncBuf{}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		up := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			select {
			case <-done:
				deadline = time.Time{}
			default:
			}
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				c.Close()
				up = true
				break
			}
		}
		if !up {
			cmd.Process.Kill()
			<-done
			t.Logf("sshd on port %d did not start: %s", port, log)
			continue
		}
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		hostPub, err := os.ReadFile(hostKey + ".pub")
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(hostPub))
		knownHosts := filepath.Join(dir, "known_hosts")
		os.WriteFile(knownHosts, []byte(fmt.Sprintf("[127.0.0.1]:%d %s %s\n", port, fields[0], fields[1])), 0o644)
		emptyKnown := filepath.Join(dir, "known_hosts.empty")
		os.WriteFile(emptyKnown, nil, 0o644)
		base := func(key, kh string) []string {
			return []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
				"-o", "UserKnownHostsFile=" + kh, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes"}
		}
		s = &SSHD{Dir: dir, Port: port, log: log,
			Args:            base(userKey, knownHosts),
			WrongKeyArgs:    base(wrongKey, knownHosts),
			NoKnownHostArgs: base(userKey, emptyKnown),
		}
	}
	if s == nil {
		t.Fatal("sshd did not start")
	}
	return s
}

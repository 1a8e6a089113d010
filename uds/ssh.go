package uds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SSHOptions configures how Dial reaches an ssh:// address. The zero value
// runs "ssh" from PATH with the user's own configuration: ~/.ssh/config,
// the agent, known_hosts and ProxyJump all apply.
//
// Dial runs, for each connection,
//
//	ssh -N -T -o ExitOnForwardFailure=yes -o BatchMode=yes [-p PORT] [Args...] -L LOCAL:PATH -- [USER@]HOST
//
// where LOCAL is a socket in a fresh 0700 temp directory, and connects to
// LOCAL once ssh has bound it. OpenSSH's stream-local forwarding connects
// to PATH on the remote host as the login user, so a remote server sees
// that user's uid in SO_PEERCRED, and the remote needs nothing but sshd
// (no udskit). (`ssh -W` cannot be used: OpenSSH 9.2 accepts only
// host:port there; a path is silently not forwarded.) BatchMode means no
// password or passphrase prompt: keys come from the agent or the config.
type SSHOptions struct {
	// Binary is the ssh client to run. Default "ssh", looked up in PATH.
	Binary string
	// Args are extra ssh arguments, put before the destination (e.g.
	// "-i", "key", "-o", "UserKnownHostsFile=known_hosts").
	Args []string
	// StartTimeout bounds ssh's start: connecting, host key check,
	// authentication, binding the local socket. Default 20s (ctx also bounds it).
	StartTimeout time.Duration
}

// SSHError says why an ssh:// dial failed. Reason is one of the names below,
// for callers (and udskit doctor) that branch.
type SSHError struct {
	// Reason: "no_ssh" (no ssh binary), "host_key" (host key unknown or
	// changed), "auth" (authentication refused), "connect" (no ssh server
	// there, or the name does not resolve), "remote_socket" (the remote
	// socket is missing or the login user may not connect to it),
	// "forward_refused" (the server forbids stream-local forwarding),
	// "other".
	Reason string
	Cause  string
	// Stderr is what ssh printed (its last lines), for the curious.
	Stderr string
	Err    error
}

func (e *SSHError) Error() string {
	if e.Stderr != "" {
		return e.Cause + " (ssh: " + e.Stderr + ")"
	}
	return e.Cause
}

func (e *SSHError) Unwrap() error { return e.Err }

// ErrNoSSH is wrapped by the SSHError for a missing ssh binary.
var ErrNoSSH = errors.New("no ssh client binary")

func dialSSH(ctx context.Context, a Addr, opts DialOptions) (net.Conn, error) {
	t := a.SSH()
	fail := func(se *SSHError) (net.Conn, error) {
		return nil, &DialError{Addr: a, Cause: se.Error(), Err: se}
	}
	bin := opts.SSH.Binary
	if bin == "" {
		bin = "ssh"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return fail(&SSHError{Reason: "no_ssh", Cause: fmt.Sprintf("no ssh client %q: install OpenSSH's client (Debian: apt install openssh-client)", bin), Err: fmt.Errorf("%w: %w", ErrNoSSH, err)})
	}
	dir, err := os.MkdirTemp("", "udskit-ssh-")
	if err != nil {
		return nil, &DialError{Addr: a, Cause: "temp dir for the forwarded socket: " + err.Error(), Err: err}
	}
	local := filepath.Join(dir, "s.sock")
	if len(local)+1 > sunPathMax {
		os.RemoveAll(dir)
		err := &PathTooLongError{Path: local, Len: len(local), Max: sunPathMax}
		return nil, &DialError{Addr: a, Cause: err.Error() + " (set TMPDIR to a shorter directory)", Err: err}
	}
	args := []string{"-N", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-o", "StreamLocalBindMask=0177"}
	if t.Port != "" {
		args = append(args, "-p", t.Port)
	}
	args = append(args, opts.SSH.Args...)
	args = append(args, "-L", local+":"+t.Path, "--", t.Destination())
	cmd := exec.Command(path, args...)
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stderr = stderr
	cmd.SysProcAttr = sshProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return fail(&SSHError{Reason: "no_ssh", Cause: "cannot run " + path + ": " + err.Error(), Err: err})
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(2 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(dir)
	}
	start := opts.SSH.StartTimeout
	if start <= 0 {
		start = 20 * time.Second
	}
	timer := time.NewTimer(start)
	defer timer.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var d net.Dialer
	var c net.Conn
	for {
		if fi, err := os.Lstat(local); err == nil && fi.Mode().Type() == fs.ModeSocket {
			// ssh binds, then listens: a refused connect means "not yet".
			if c, err = d.DialContext(ctx, "unix", local); err == nil {
				break
			} else if !errors.Is(err, syscall.ECONNREFUSED) {
				stop()
				return nil, &DialError{Addr: a, Cause: "connect to ssh's forwarded socket: " + err.Error(), Err: err}
			}
		}
		select {
		case <-exited:
			os.RemoveAll(dir)
			return fail(classifySSH(stderr.String(), waitErr, t))
		case <-ctx.Done():
			stop()
			return nil, &DialError{Addr: a, Cause: "ssh did not get through in time (" + ctx.Err().Error() + ")", Err: ctx.Err()}
		case <-timer.C:
			stop()
			return fail(&SSHError{Reason: "connect", Cause: fmt.Sprintf("ssh to %s did not set up the forwarding within %s", t.Destination(), start), Stderr: lastLines(stderr.String()), Err: context.DeadlineExceeded})
		case <-tick.C:
		}
	}
	return &sshConn{Conn: c, target: t, stderr: stderr, stop: sync.OnceFunc(stop)}, nil
}

// sshConn is a connection through an ssh process; Close ends the process.
type sshConn struct {
	net.Conn
	target SSHTarget
	stderr *tailBuffer
	stop   func()
	got    bool // a byte was read
}

func (c *sshConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.got = true
	}
	if err != nil && !c.got {
		// ssh closes its end when the remote connect fails, right after
		// printing why: give its stderr a moment to arrive.
		for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if strings.Contains(c.stderr.String(), "open failed") {
				break
			}
		}
		if s := c.stderr.String(); strings.Contains(s, "open failed") {
			return n, &SSHError{Reason: "remote_socket", Cause: fmt.Sprintf("the remote socket %s on %s could not be opened: it is missing (is the server running there?), or %s may not connect to it", c.target.Path, c.target.Host, loginUser(c.target)), Stderr: lastLines(s), Err: err}
		}
	}
	return n, err
}

func (c *sshConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *sshConn) Close() error {
	err := c.Conn.Close()
	c.stop()
	return err
}

func loginUser(t SSHTarget) string {
	if t.User != "" {
		return "user " + t.User
	}
	return "the login user"
}

// classifySSH explains why ssh exited before the forwarding was up.
func classifySSH(stderr string, waitErr error, t SSHTarget) *SSHError {
	se := &SSHError{Stderr: lastLines(stderr), Err: waitErr}
	if se.Err == nil {
		se.Err = errors.New("ssh exited")
	}
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "host key verification failed"), strings.Contains(s, "host key is known"),
		strings.Contains(s, "remote host identification has changed"):
		se.Reason = "host_key"
		se.Cause = fmt.Sprintf("the host key of %s is unknown or changed: check it and add it to known_hosts (connect once with ssh %s, or ssh-keyscan)", t.Host, t.Destination())
	case strings.Contains(s, "permission denied"):
		se.Reason = "auth"
		se.Cause = fmt.Sprintf("authentication refused by %s for %s: load a key the server accepts into ssh-agent, or name it in ~/.ssh/config (no password prompts: BatchMode)", t.Host, loginUser(t))
	case strings.Contains(s, "could not resolve hostname"):
		se.Reason = "connect"
		se.Cause = fmt.Sprintf("host %s does not resolve (nor is it a Host alias in ~/.ssh/config)", t.Host)
	case strings.Contains(s, "connection refused"), strings.Contains(s, "connection timed out"), strings.Contains(s, "no route to host"):
		se.Reason = "connect"
		se.Cause = fmt.Sprintf("no ssh server answers at %s", t.Host+portSuffix(t))
	case strings.Contains(s, "administratively prohibited"), strings.Contains(s, "forwarding disabled"):
		se.Reason = "forward_refused"
		se.Cause = "the ssh server forbids forwarding to unix sockets (sshd_config: AllowStreamLocalForwarding, DisableForwarding)"
	default:
		se.Reason = "other"
		se.Cause = fmt.Sprintf("ssh to %s failed", t.Destination())
	}
	return se
}

func portSuffix(t SSHTarget) string {
	if t.Port == "" {
		return ""
	}
	return ":" + t.Port
}

// lastLines returns the last few non-empty lines of s, joined by "; ".
func lastLines(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	if len(out) > 3 {
		out = out[len(out)-3:]
	}
	return strings.Join(out, "; ")
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}

var _ io.Writer = (*tailBuffer)(nil)

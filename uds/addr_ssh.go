package uds

import (
	"fmt"
	"strconv"
	"strings"
)

// SSHTarget is an ssh:// address taken apart: the login user (empty: ssh's
// own choice, from ~/.ssh/config or the local user name), the host (an IPv6
// address without brackets; it may be a Host alias of ~/.ssh/config), the
// port as written (empty: ssh's choice) and the remote socket's path.
type SSHTarget struct {
	User, Host, Port, Path string
}

// Destination is the host argument for ssh: "user@host" or "host".
func (t SSHTarget) Destination() string {
	if t.User != "" {
		return t.User + "@" + t.Host
	}
	return t.Host
}

// SSH splits an ssh:// address (a.Kind == SSH) into its parts; for any other
// kind it returns the zero SSHTarget.
func (a Addr) SSH() SSHTarget {
	if a.Kind != SSH {
		return SSHTarget{}
	}
	t, _ := splitSSH(a.Name)
	return t
}

// maxSSHPath is the longest remote socket path: sun_path on Linux, less its NUL.
const maxSSHPath = 107

// parseSSHAddr parses "ssh://[user@]host[:port]/path" (protocol/addresses.json).
func parseSSHAddr(s string) (Addr, error) {
	rest, ok := strings.CutPrefix(s, "ssh://")
	if !ok {
		return Addr{}, &AddrError{Input: s, Name: "bad_ssh", Reason: "want ssh://[user@]host[:port]/path/to.sock"}
	}
	t, err := splitSSH(rest)
	if err != nil {
		err.Input = s
		return Addr{}, err
	}
	return Addr{Kind: SSH, Name: t.name()}, nil
}

func (t SSHTarget) name() string {
	var b strings.Builder
	if t.User != "" {
		b.WriteString(t.User + "@")
	}
	if strings.ContainsRune(t.Host, ':') {
		b.WriteString("[" + t.Host + "]")
	} else {
		b.WriteString(t.Host)
	}
	if t.Port != "" {
		b.WriteString(":" + t.Port)
	}
	b.WriteString(t.Path)
	return b.String()
}

func splitSSH(rest string) (SSHTarget, *AddrError) {
	bad := func(name, reason string) (SSHTarget, *AddrError) {
		return SSHTarget{}, &AddrError{Input: "ssh://" + rest, Name: name, Reason: reason}
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return bad("bad_ssh", "ssh:// wants a remote socket path: ssh://[user@]host[:port]/path/to.sock")
	}
	auth, path := rest[:slash], rest[slash:]
	var t SSHTarget
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		t.User, auth = auth[:at], auth[at+1:]
		if !validSSHUser(t.User) {
			return bad("bad_user", fmt.Sprintf("ssh user %q: want printable characters without ':' or '/', not starting with '-'", t.User))
		}
	}
	hostport := auth
	if strings.HasPrefix(auth, "[") {
		end := strings.IndexByte(auth, ']')
		if end < 0 {
			return bad("bad_host", "missing ']' after an IPv6 host")
		}
		t.Host = auth[1:end]
		if !validIPv6Chars(t.Host) {
			return bad("bad_host", fmt.Sprintf("host %q in brackets is not an IPv6 address", t.Host))
		}
		hostport = auth[end+1:]
		if hostport != "" && !strings.HasPrefix(hostport, ":") {
			return bad("bad_host", "unexpected text after ']'")
		}
		if hostport != "" {
			t.Port = hostport[1:]
			if !validSSHPort(t.Port) {
				return bad("bad_port", fmt.Sprintf("port %q is not a number from 1 to 65535", t.Port))
			}
		}
	} else {
		if i := strings.LastIndexByte(auth, ':'); i >= 0 {
			t.Host, t.Port = auth[:i], auth[i+1:]
			if strings.ContainsRune(t.Host, ':') {
				return bad("bad_host", "an IPv6 host needs [brackets]")
			}
			if !validSSHPort(t.Port) {
				return bad("bad_port", fmt.Sprintf("port %q is not a number from 1 to 65535", t.Port))
			}
		} else {
			t.Host = auth
		}
		if !validSSHHost(t.Host) {
			return bad("bad_host", fmt.Sprintf("host %q: want a host name (letters, digits, '.', '-', '_', not starting with '-') or [IPv6]", t.Host))
		}
	}
	if len(path) > maxSSHPath {
		return bad("bad_ssh_path", fmt.Sprintf("remote socket path is %d bytes, over the %d a socket path may have", len(path), maxSSHPath))
	}
	for i := 0; i < len(path); i++ {
		if c := path[i]; c < 0x20 || c == 0x7f || c == ':' {
			return bad("bad_ssh_path", "remote socket path has ':' or a control character (OpenSSH's forwarding syntax cannot carry it)")
		}
	}
	t.Path = path
	return t, nil
}

func validSSHUser(u string) bool {
	if u == "" || u[0] == '-' {
		return false
	}
	for i := 0; i < len(u); i++ {
		if c := u[i]; c < 0x21 || c > 0x7e || c == ':' || c == '/' {
			return false
		}
	}
	return true
}

func validSSHHost(h string) bool {
	if h == "" || h[0] == '-' {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func validIPv6Chars(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c >= '0' && c <= '9' || c == ':' || c == '.') {
			return false
		}
	}
	return true
}

func validSSHPort(p string) bool {
	if len(p) > 5 || !isDigits(p) {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

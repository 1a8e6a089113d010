package uds

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Kind is the transport an Addr names.
type Kind uint8

const (
	// Unix is a unix stream socket bound to a filesystem path.
	Unix Kind = iota + 1
	// Abstract is a unix stream socket in the Linux abstract namespace (no file).
	Abstract
	// TCP is a TCP socket, host:port.
	TCP
	// Passed is a listening socket this process inherited, not one it binds:
	// "systemd:NAME" (socket activation, LISTEN_FDNAMES) or "fd:N". Name holds
	// the whole form. Only Listen accepts it (see ListenFD).
	Passed
	// TLS is TCP with TLS 1.3, host:port (see TLSConfig and tlsfiles).
	TLS
	// SSH is a unix socket on another host reached through the system's ssh
	// client: Name is "[user@]host[:port]/path" (see Addr.SSH). Dial only.
	SSH
)

func (k Kind) String() string {
	switch k {
	case Unix:
		return "unix"
	case Abstract:
		return "abstract"
	case TCP:
		return "tcp"
	case Passed:
		return "passed"
	case TLS:
		return "tls"
	case SSH:
		return "ssh"
	}
	return "invalid"
}

// Addr is a parsed udskit address. The zero value is invalid.
//
// Accepted forms (see docs/addresses.md):
//
//	unix:/run/app.sock, /tmp/x.sock, ./x.sock, x.sock   unix socket at a path
//	unix:@name, @name                                   Linux abstract namespace
//	tcp:127.0.0.1:7000, tcp:[::1]:7000, localhost:7000  TCP
//	systemd:NAME, fd:3                                  an inherited listening socket (Listen only)
//	tls:host:port, tls:[::1]:8443                       TCP with TLS 1.3
//	ssh://[user@]host[:port]/path/to.sock               a remote unix socket through ssh (Dial only)
type Addr struct {
	Kind Kind
	// Name is the path (Unix), the abstract name without its leading '@' (Abstract),
	// host:port (TCP, TLS), or "[user@]host[:port]/path" (SSH, see Addr.SSH).
	Name string
}

// AddrForms lists the accepted address forms, for error messages and help text.
const AddrForms = "unix:/path/to.sock, /path/to.sock, ./rel.sock, unix:@name, @name, tcp:host:port, host:port, tls:host:port, ssh://[user@]host[:port]/path/to.sock (dial only), systemd:NAME, fd:N (listen only)"

// AddrError reports an address that does not parse.
type AddrError struct {
	Input string
	// Name is the language-neutral error name from protocol/addresses.json
	// ("empty", "bad_port", "unknown_scheme", ...), for callers that branch.
	Name   string
	Reason string
}

func (e *AddrError) Error() string {
	return fmt.Sprintf("bad address %q: %s (accepted forms: %s)", e.Input, e.Reason, AddrForms)
}

// ErrAbstractUnsupported is returned for abstract names on systems without
// the Linux abstract namespace.
var ErrAbstractUnsupported = errors.New("abstract unix socket names (@name) exist only on Linux")

// MaxAddrLen caps the length of an address string ParseAddr accepts.
const MaxAddrLen = 4096

// ParseAddr parses an address in any of the forms listed in AddrForms. Both
// the input and its canonical form (String) are at most MaxAddrLen bytes, so
// the canonical form of every address it returns parses again.
func ParseAddr(s string) (Addr, error) {
	a, err := parseAddr(s)
	if err == nil {
		if n := len(a.String()); n > MaxAddrLen {
			return Addr{}, &AddrError{Input: s[:64] + "...", Name: "too_long", Reason: fmt.Sprintf("%d bytes in canonical form (%s...), over the %d-byte limit", n, a.String()[:8], MaxAddrLen)}
		}
	}
	return a, err
}

func parseAddr(s string) (Addr, error) {
	bad := func(name, reason string) (Addr, error) {
		return Addr{}, &AddrError{Input: s, Name: name, Reason: reason}
	}
	if s == "" {
		return bad("empty", "empty address")
	}
	if len(s) > MaxAddrLen {
		return Addr{}, &AddrError{Input: s[:64] + "...", Name: "too_long", Reason: fmt.Sprintf("%d bytes, over the %d-byte limit", len(s), MaxAddrLen)}
	}
	if strings.IndexByte(s, 0) >= 0 {
		return bad("nul_byte", "contains a NUL byte")
	}
	switch {
	case strings.HasPrefix(s, "unix:"):
		rest := s[len("unix:"):]
		if strings.HasPrefix(rest, "@") {
			return parseAbstract(s, rest[1:])
		}
		if rest == "" {
			return bad("empty_path", "empty socket path after unix:")
		}
		return Addr{Kind: Unix, Name: rest}, nil
	case strings.HasPrefix(s, "@"):
		return parseAbstract(s, s[1:])
	case strings.HasPrefix(s, "tcp:"):
		return parseTCP(s, s[len("tcp:"):])
	case strings.HasPrefix(s, "tls:"):
		a, err := parseTCP(s, s[len("tls:"):])
		a.Kind = TLS
		if err != nil {
			return Addr{}, err
		}
		return a, nil
	case strings.HasPrefix(s, "ssh:"):
		return parseSSHAddr(s)
	case strings.HasPrefix(s, "systemd:"), strings.HasPrefix(s, "fd:"):
		return parsePassed(s)
	case schemeLike(s) != "":
		// "http://x", "unixgram:/x", "udp:1.2.3.4:5": a scheme udskit does not speak.
		return bad("unknown_scheme", fmt.Sprintf("unknown scheme %q", schemeLike(s)))
	case strings.ContainsRune(s, '/'):
		return Addr{Kind: Unix, Name: s}, nil
	case strings.ContainsRune(s, ':'):
		return parseTCP(s, s)
	default:
		// A bare name with neither '/' nor ':' is a relative socket path.
		return Addr{Kind: Unix, Name: s}, nil
	}
}

// MustParseAddr is ParseAddr that panics on error, for tests and constants.
func MustParseAddr(s string) Addr {
	a, err := ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

func parseAbstract(input, name string) (Addr, error) {
	if name == "" {
		return Addr{}, &AddrError{Input: input, Name: "empty_abstract", Reason: "empty abstract name after @"}
	}
	if !abstractSupported {
		return Addr{}, fmt.Errorf("address %q: %w", input, ErrAbstractUnsupported)
	}
	return Addr{Kind: Abstract, Name: name}, nil
}

func parseTCP(input, hostport string) (Addr, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return Addr{}, &AddrError{Input: input, Name: "bad_hostport", Reason: "want host:port, with [brackets] around IPv6 hosts"}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil || !isDigits(port) {
		reason := fmt.Sprintf("port %q is not a number from 0 to 65535", port)
		if foreignSchemes[strings.ToLower(host)] {
			// "udp:x" reads as host "udp", port "x"; say what was likely meant.
			reason += fmt.Sprintf(`; if %q is meant as a scheme: udskit speaks unix:, tcp:, tls: and ssh://`, host)
		}
		return Addr{}, &AddrError{Input: input, Name: "bad_port", Reason: reason}
	}
	if strings.ContainsAny(host, " /") {
		return Addr{}, &AddrError{Input: input, Name: "bad_host", Reason: fmt.Sprintf("host %q is not a host name or IP", host)}
	}
	return Addr{Kind: TCP, Name: net.JoinHostPort(host, port)}, nil
}

// schemeLike returns the word before the first colon when s looks like
// "word:/..." or "word:x:y" (a URL or a scheme:host:port), else "".
func schemeLike(s string) string {
	i := strings.IndexByte(s, ':')
	if i <= 0 || !isWord(s[:i]) {
		return ""
	}
	rest := s[i+1:]
	if strings.HasPrefix(rest, "/") || strings.ContainsRune(rest, ':') && !strings.HasPrefix(rest, "[") {
		return s[:i]
	}
	return ""
}

// foreignSchemes are schemes people type that udskit does not speak.
var foreignSchemes = map[string]bool{"udp": true, "udp4": true, "udp6": true, "tcp4": true, "tcp6": true, "http": true,
	"https": true, "unixgram": true, "unixpacket": true, "ws": true, "wss": true, "grpc": true, "file": true, "ip": true}

func isWord(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// String returns the canonical form, which ParseAddr maps back to the same Addr:
// "unix:PATH", "unix:@NAME", "tcp:HOST:PORT", "tls:HOST:PORT" or "ssh://NAME".
func (a Addr) String() string {
	switch a.Kind {
	case Unix:
		return "unix:" + a.Name
	case Abstract:
		return "unix:@" + a.Name
	case TCP:
		return "tcp:" + a.Name
	case TLS:
		return "tls:" + a.Name
	case SSH:
		return "ssh://" + a.Name
	case Passed:
		return a.Name
	}
	return "invalid:" + a.Name
}

// Network returns the Go network name, "unix" or "tcp", so Addr is a net.Addr.
// A tls: address is "tcp" (TLS runs over it); an ssh:// address is "unix"
// (a unix socket at the far end).
func (a Addr) Network() string {
	if a.Kind == TCP || a.Kind == TLS {
		return "tcp"
	}
	return "unix"
}

// IsUnix reports whether a is a unix socket (path or abstract).
func (a Addr) IsUnix() bool { return a.Kind == Unix || a.Kind == Abstract }

// SockaddrName is the name to hand to net.Dial/net.Listen: the path, "@name"
// for abstract names (Go maps a leading '@' to the abstract namespace), or host:port.
func (a Addr) SockaddrName() string {
	if a.Kind == Abstract {
		return "@" + a.Name
	}
	return a.Name
}

var _ net.Addr = Addr{}

// parsePassed checks "systemd:NAME" (a LISTEN_FDNAMES name: 1 to 255 printable
// characters, no ':') and "fd:N" (a decimal descriptor number).
func parsePassed(s string) (Addr, error) {
	scheme, rest, _ := strings.Cut(s, ":")
	if scheme == "fd" {
		if !isDigits(rest) || len(rest) > 9 {
			return Addr{}, &AddrError{Input: s, Name: "bad_fd", Reason: "fd:N wants a descriptor number, e.g. fd:3"}
		}
		return Addr{Kind: Passed, Name: s}, nil
	}
	if rest == "" || len(rest) > 255 {
		return Addr{}, &AddrError{Input: s, Name: "bad_systemd_name", Reason: "systemd:NAME wants the socket's FileDescriptorName= (1 to 255 characters)"}
	}
	for _, c := range rest {
		if c < 0x21 || c > 0x7e || c == ':' {
			return Addr{}, &AddrError{Input: s, Name: "bad_systemd_name", Reason: "a systemd socket name is printable ASCII without ':' or spaces"}
		}
	}
	return Addr{Kind: Passed, Name: s}, nil
}

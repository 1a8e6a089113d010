package doctor

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/rpc"
	"github.com/udskit/udskit/uds"
)

// MaxSniff caps how many bytes the sniff reads from a server.
const MaxSniff = 512

// Probes: the only bytes the doctor ever sends. Each is something the named
// server answers without side effects:
//
//	postgres: SSLRequest (8 bytes); the server answers 'S' or 'N' and waits for a startup packet.
//	redis:    an inline PING; the server answers +PONG (or -NOAUTH when a password is set).
//	http:     GET /_ping HTTP/1.0 (Docker's health endpoint; any HTTP server answers a status line).
//	udskit:   a udskit client hello, version 1 (the server answers with its own hello).
//
// A probe is sent only when the server said nothing first and the socket's
// name (or Options.Probe) says which protocol it speaks: unknown servers only
// get listened to.
var probes = map[string][]byte{
	"postgres": {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f},
	"redis":    []byte("PING\r\n"),
	"http":     []byte("GET /_ping HTTP/1.0\r\nHost: localhost\r\n\r\n"),
	"udskit":   udskitHello(),
}

// udskitHello is a client hello from the frame package's encoder: the
// version it speaks, and a 64 KiB max frame (the doctor reads no frames).
func udskitHello() []byte {
	b := make([]byte, frame.HelloSize)
	h := frame.Hello{Version: frame.Version, MaxFrame: 64 << 10}
	h.Put(b)
	return b
}

func probeFor(a uds.Addr, opts Options) string {
	if opts.Probe != "" {
		return opts.Probe
	}
	if a.Kind != uds.Unix {
		return ""
	}
	base := filepath.Base(a.Name)
	switch {
	case pgName.MatchString(base):
		return "postgres"
	case strings.HasPrefix(base, "redis"):
		return "redis"
	case base == "docker.sock" || base == "podman.sock" || strings.Contains(base, "http"):
		return "http"
	case strings.Contains(base, "udskit"):
		return "udskit"
	}
	return ""
}

// Identify names the protocol of what a server sent (greeting, or answer to
// probe). It is a pure function of at most MaxSniff bytes.
func Identify(probe string, b []byte) (proto, detail string) {
	if len(b) > MaxSniff {
		b = b[:MaxSniff]
	}
	if code, msg, ok := udskitRefusal(b); ok {
		return "udskit", fmt.Sprintf("a udskit server refused this connection in place of its hello (error %s): %s", rpc.Code(code), msg)
	}
	switch {
	case len(b) == 0:
		return "", ""
	case bytes.HasPrefix(b, frame.Magic[:]):
		h, err := frame.ParseHello(b)
		if err != nil {
			return "udskit", "udskit magic but not a valid hello: " + err.Error()
		}
		return "udskit", fmt.Sprintf("udskit hello, protocol version %d, max frame %d bytes, max in-flight %d",
			h.Version, h.MaxFrame, h.MaxInFlight)
	case bytes.HasPrefix(b, []byte("HTTP/")):
		line, _, _ := bytes.Cut(b, []byte("\r\n"))
		return "http", "HTTP server: " + printable(line)
	case bytes.HasPrefix(b, []byte("SSH-")):
		line, _, _ := bytes.Cut(b, []byte("\r\n"))
		return "ssh", "SSH server: " + printable(line)
	case probe == "postgres" && len(b) == 1 && (b[0] == 'S' || b[0] == 'N'):
		ssl := "without SSL"
		if b[0] == 'S' {
			ssl = "with SSL"
		}
		return "postgresql", "PostgreSQL answered the SSL request (" + ssl + ")"
	case probe == "postgres" && b[0] == 'E':
		return "postgresql", "PostgreSQL answered with an error: " + printable(b[min(5, len(b)):])
	case probe == "redis" && (bytes.HasPrefix(b, []byte("+PONG")) || bytes.HasPrefix(b, []byte("-NOAUTH")) || bytes.HasPrefix(b, []byte("-ERR"))):
		line, _, _ := bytes.Cut(b, []byte("\r\n"))
		return "redis", "Redis answered PING: " + printable(line)
	case isMySQLGreeting(b):
		ver, _, _ := bytes.Cut(b[5:], []byte{0})
		return "mysql", "MySQL/MariaDB handshake, server version " + printable(ver)
	}
	return "", "server sent " + fmt.Sprintf("%q", b[:min(len(b), 64)])
}

// udskitRefusal recognises a udskit server's refusal (protocol/spec.md 5.4):
// one connection-level error frame (id 0, a code, the message as its head,
// no payload) in place of the hello, complete within b.
func udskitRefusal(b []byte) (code uint32, msg string, ok bool) {
	if len(b) < frame.HeaderSize || b[0] != byte(frame.TypeError) {
		return 0, "", false
	}
	h := frame.ParseHeader(b)
	if h.ID != 0 || h.Aux == 0 || h.Aux > uint32(rpc.ProtocolViolation) || h.PayloadLen != 0 || h.HeadLen == 0 ||
		int(h.HeadLen) > len(b)-frame.HeaderSize {
		return 0, "", false
	}
	return h.Aux, printable(b[frame.HeaderSize : frame.HeaderSize+int(h.HeadLen)]), true
}

// isMySQLGreeting: a packet header (3-byte little-endian length, sequence 0)
// then protocol version 10 and a NUL-terminated server version.
func isMySQLGreeting(b []byte) bool {
	if len(b) < 6 || b[3] != 0 || b[4] != 10 {
		return false
	}
	plen := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
	return plen >= 10 && plen < 1<<12 && bytes.IndexByte(b[5:], 0) > 0
}

func printable(b []byte) string {
	s := strings.Map(func(r rune) rune {
		if r < 32 || r > 126 {
			return '.'
		}
		return r
	}, string(b))
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func sniff(ctx context.Context, r *Report, c net.Conn, a uds.Addr, svc *service, opts Options) {
	probe := probeFor(a, opts)
	buf := make([]byte, MaxSniff)
	deadline := time.Now().Add(opts.SniffTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetReadDeadline(deadline)
	n, _ := c.Read(buf)
	if n > 0 {
		proto, detail := Identify("", buf[:n])
		r.Protocol = proto
		if proto == "" {
			r.add("protocol", Skip, "", "the server spoke first but in no protocol the doctor knows: %s", detail)
			return
		}
		if code, _, refused := udskitRefusal(buf[:n]); refused {
			r.udskitRefused = true
			fix := "the server said why in its message above: act on it, then retry"
			if rpc.Code(code) == rpc.PermissionDenied {
				fix = "run the client as a user the server's peer policy allows, or ask its operator to allow this one (udskit serve --allow-uid; a Go server's uds.ListenOptions.Policy)"
			}
			r.add("protocol", Warn, fix, "%s", detail)
			return
		}
		r.add("protocol", Pass, "", "%s (it spoke first)", detail)
		return
	}
	p, ok := probes[probe]
	if probe == "none" || !ok {
		r.add("protocol", Skip, "pass --probe http|postgres|redis|udskit to send that protocol's harmless opening",
			"the server sent nothing within %s, and the name does not say which protocol is safe to try", opts.SniffTimeout)
		return
	}
	c.SetDeadline(time.Now().Add(opts.SniffTimeout + 200*time.Millisecond))
	if _, err := c.Write(p); err != nil {
		r.add("protocol", Warn, "", "sending the %s probe failed: %v", probe, err)
		return
	}
	n, err := c.Read(buf)
	if n == 0 {
		r.add("protocol", Warn, "the server accepted but did not answer: it may be stuck, or speak another protocol",
			"no answer to a %s probe within %s (%v)", probe, opts.SniffTimeout+200*time.Millisecond, err)
		return
	}
	proto, detail := Identify(probe, buf[:n])
	r.Protocol = proto
	if proto == "" {
		r.add("protocol", Warn, "", "the answer to a %s probe was not %s: %s", probe, probe, detail)
		return
	}
	r.add("protocol", Pass, "", "%s", detail)
	_ = svc
}

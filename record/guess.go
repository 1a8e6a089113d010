package record

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"strings"
)

// UdskitPort is the TCP port udskit connections are shown on; the udskit
// Wireshark dissector (wireshark/udskit.lua) registers itself for it.
const UdskitPort = 7377

// Well-known ports whose Wireshark dissectors decode the protocol.
const (
	PortHTTP     = 80
	PortPostgres = 5432
	PortRedis    = 6379
	PortMySQL    = 3306
	// PortData is used when nothing is recognised: no dissector, raw data.
	PortData = 9
)

// GuessPort guesses the server port from a socket's path alone; 0 when the
// name says nothing. why says what matched.
func GuessPort(path string) (port uint16, why string) {
	base := strings.ToLower(filepath.Base(path))
	switch {
	case strings.HasPrefix(base, ".s.pgsql."):
		return PortPostgres, "PostgreSQL (socket name .s.PGSQL.*)"
	case strings.Contains(base, "redis"):
		return PortRedis, "Redis (socket name)"
	case strings.Contains(base, "mysql") || strings.Contains(base, "mariadb"):
		return PortMySQL, "MySQL (socket name)"
	case strings.Contains(base, "udskit"):
		return UdskitPort, "udskit (socket name)"
	case strings.Contains(base, "docker") || strings.Contains(base, "podman") || strings.Contains(base, "http"):
		return PortHTTP, "HTTP (socket name)"
	}
	return 0, ""
}

// maxSniff is how many first bytes SniffPort looks at.
const maxSniff = 64

// SniffPort guesses the server port from the first bytes sent in dir; 0
// when they say nothing. It reads at most the first 64 bytes of p.
func SniffPort(dir Dir, p []byte) (port uint16, why string) {
	if len(p) > maxSniff {
		p = p[:maxSniff]
	}
	if dir == ServerToClient {
		// MySQL's server speaks first: 3-byte length, sequence 0, protocol 10.
		if len(p) >= 5 && p[3] == 0 && p[4] == 10 && int(p[0])|int(p[1])<<8|int(p[2])<<16 > 0 {
			return PortMySQL, "MySQL (server greeting)"
		}
		return 0, ""
	}
	switch {
	case bytes.HasPrefix(p, []byte("UDSK")):
		return UdskitPort, "udskit (hello)"
	case len(p) > 0 && p[0] == '{':
		return UdskitPort, "udskit NDJSON (first byte '{')"
	case isHTTP(p):
		return PortHTTP, "HTTP (request line)"
	case len(p) >= 2 && p[0] == '*' && p[1] >= '0' && p[1] <= '9':
		return PortRedis, "Redis (RESP array)"
	case len(p) >= 8 && isPostgresStart(p):
		return PortPostgres, "PostgreSQL (startup packet)"
	}
	return 0, ""
}

var httpMethods = []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "PATCH ", "OPTIONS ", "CONNECT ", "TRACE ", "PRI * HTTP/2"}

func isHTTP(p []byte) bool {
	for _, m := range httpMethods {
		if bytes.HasPrefix(p, []byte(m)) {
			return true
		}
	}
	return false
}

func isPostgresStart(p []byte) bool {
	n := binary.BigEndian.Uint32(p)
	code := binary.BigEndian.Uint32(p[4:])
	if n < 8 || n > 10000 {
		return false
	}
	switch code {
	case 0x00030000, 80877103, 80877102, 80877104: // v3 startup, SSL, cancel, GSSENC
		return true
	}
	return false
}

package socklist

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Caps for the decoders: a hostile or broken input costs at most this much.
const (
	// MaxProcNetUnixBytes bounds how much of /proc/net/unix is read (64 MiB,
	// about 400k sockets).
	MaxProcNetUnixBytes = 64 << 20
	// maxLine bounds one line of /proc/net/unix (header fields + a 108-byte path
	// with escapes fits easily).
	maxLine = 4096
	// MaxSockets bounds the number of sockets one snapshot holds.
	MaxSockets = 1 << 20
)

const soAcceptCon = 1 << 16 // __SO_ACCEPTCON in the Flags column: a listener

// ParseProcNetUnix parses the text of /proc/net/unix. Lines that do not parse
// are skipped and counted in bad; reading stops at MaxProcNetUnixBytes.
func ParseProcNetUnix(r io.Reader) (socks []Socket, bad int, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, MaxProcNetUnixBytes))
	sc.Buffer(make([]byte, 0, 1024), maxLine)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			if strings.HasPrefix(line, "Num") {
				continue
			}
		}
		s, ok := parseProcNetUnixLine(line)
		if !ok {
			bad++
			continue
		}
		if len(socks) >= MaxSockets {
			return socks, bad, fmt.Errorf("/proc/net/unix: more than %d sockets", MaxSockets)
		}
		socks = append(socks, s)
	}
	if err := sc.Err(); err != nil {
		return socks, bad, fmt.Errorf("/proc/net/unix: %w", err)
	}
	return socks, bad, nil
}

// parseProcNetUnixLine parses one line:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000000000000000: 00000002 00000000 00010000 0001 01 12345 /run/x.sock
func parseProcNetUnixLine(line string) (Socket, bool) {
	f := strings.Fields(line)
	if len(f) < 7 || !strings.HasSuffix(f[0], ":") {
		return Socket{}, false
	}
	flags, err1 := strconv.ParseUint(f[3], 16, 32)
	typ, err2 := strconv.ParseUint(f[4], 16, 16)
	st, err3 := strconv.ParseUint(f[5], 16, 8)
	ino, err4 := strconv.ParseUint(f[6], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Socket{}, false
	}
	s := Socket{Inode: ino, Type: typeName(uint8(typ)), UID: -1}
	if len(f) > 7 {
		// The path is everything after the inode column; it may contain spaces.
		idx := indexField(line, 7)
		if idx < 0 {
			return Socket{}, false
		}
		s.Path = line[idx:]
	}
	switch {
	case flags&soAcceptCon != 0:
		s.State = StateListening
	case st == 1:
		s.State = StateUnconnected
	case st == 2:
		s.State = StateConnecting
	case st == 3:
		s.State = StateConnected
	case st == 4:
		s.State = StateDisconnecting
	default:
		s.State = "state" + strconv.FormatUint(st, 10)
	}
	return s, true
}

// indexField returns the byte offset of the n-th (0-based) space-separated field.
func indexField(line string, n int) int {
	i, field := 0, -1
	for i < len(line) {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		if i >= len(line) {
			return -1
		}
		field++
		if field == n {
			return i
		}
		for i < len(line) && line[i] != ' ' {
			i++
		}
	}
	return -1
}

func typeName(t uint8) string {
	switch t {
	case 1:
		return "stream"
	case 2:
		return "dgram"
	case 5:
		return "seqpacket"
	}
	return "type" + strconv.Itoa(int(t))
}

package proc

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

const (
	// NetUnixPath is where Linux publishes the table.
	NetUnixPath = "/proc/net/unix"
	// MaxNetUnixBytes bounds how much of the table is read (64 MiB, about 400k sockets).
	MaxNetUnixBytes = 64 << 20
	// MaxNetUnixLine bounds one line (the header fields and a 108-byte path with
	// escapes fit easily).
	MaxNetUnixLine = 4096
	// acceptCon is __SO_ACCEPTCON in the Flags column: a listener.
	acceptCon = 1 << 16
)

// UnixEntry is one socket line.
type UnixEntry struct {
	Flags uint32
	Type  uint16 // 1 stream, 2 dgram, 5 seqpacket
	State uint8  // St: 1 unconnected, 2 connecting, 3 connected, 4 disconnecting
	Inode uint64
	Path  string // "" for an unnamed socket
}

// Listening reports whether the socket is a listener.
func (e UnixEntry) Listening() bool { return e.Flags&acceptCon != 0 }

// ScanNetUnix reads the table from r and calls fn for each entry until fn returns
// false. It returns how many lines did not parse (the header not counted).
func ScanNetUnix(r io.Reader, fn func(UnixEntry) bool) (bad int, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, MaxNetUnixBytes))
	sc.Buffer(make([]byte, 0, 1024), MaxNetUnixLine)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			if strings.HasPrefix(line, "Num") {
				continue
			}
		}
		e, ok := parseLine(line)
		if !ok {
			bad++
			continue
		}
		if !fn(e) {
			return bad, nil
		}
	}
	if err := sc.Err(); err != nil {
		return bad, fmt.Errorf("%s: %w", NetUnixPath, err)
	}
	return bad, nil
}

func parseLine(line string) (UnixEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 7 || !strings.HasSuffix(f[0], ":") {
		return UnixEntry{}, false
	}
	flags, err1 := strconv.ParseUint(f[3], 16, 32)
	typ, err2 := strconv.ParseUint(f[4], 16, 16)
	st, err3 := strconv.ParseUint(f[5], 16, 8)
	ino, err4 := strconv.ParseUint(f[6], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return UnixEntry{}, false
	}
	e := UnixEntry{Flags: uint32(flags), Type: uint16(typ), State: uint8(st), Inode: ino}
	if len(f) > 7 {
		// The path is everything after the inode column; it may contain spaces.
		i := indexField(line, 7)
		if i < 0 {
			return UnixEntry{}, false
		}
		e.Path = line[i:]
	}
	return e, true
}

// indexField returns the byte offset of the n-th (0-based) space-separated
// field, or -1.
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

// TypeName names a socket type number (as /proc/net/unix and sock_diag give it).
func TypeName(t uint16) string {
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

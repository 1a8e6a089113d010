package socklist

import (
	"fmt"
	"io"
	"strconv"

	"github.com/udskit/udskit/internal/proc"
)

// Caps for the decoders: a hostile or broken input costs at most this much.
const (
	// MaxProcNetUnixBytes bounds how much of /proc/net/unix is read.
	MaxProcNetUnixBytes = proc.MaxNetUnixBytes
	// MaxSockets bounds the number of sockets one snapshot holds.
	MaxSockets = 1 << 20
)

// ParseProcNetUnix parses the text of /proc/net/unix. Lines that do not parse
// are skipped and counted in bad; reading stops at MaxProcNetUnixBytes.
func ParseProcNetUnix(r io.Reader) (socks []Socket, bad int, err error) {
	var over bool
	bad, err = proc.ScanNetUnix(r, func(e proc.UnixEntry) bool {
		if len(socks) >= MaxSockets {
			over = true
			return false
		}
		socks = append(socks, fromEntry(e))
		return true
	})
	if over {
		return socks, bad, fmt.Errorf("/proc/net/unix: more than %d sockets", MaxSockets)
	}
	return socks, bad, err
}

func fromEntry(e proc.UnixEntry) Socket {
	s := Socket{Inode: e.Inode, Path: e.Path, Type: proc.TypeName(e.Type), UID: -1}
	switch {
	case e.Listening():
		s.State = StateListening
	case e.State == 1:
		s.State = StateUnconnected
	case e.State == 2:
		s.State = StateConnecting
	case e.State == 3:
		s.State = StateConnected
	case e.State == 4:
		s.State = StateDisconnecting
	default:
		s.State = "state" + strconv.Itoa(int(e.State))
	}
	return s
}

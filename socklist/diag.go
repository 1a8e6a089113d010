package socklist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/udskit/udskit/internal/proc"
)

// unix_diag wire constants (linux/unix_diag.h, linux/sock_diag.h); x/sys/unix
// does not carry them.
const (
	sockDiagByFamily = 20

	udiagShowName  = 0x01
	udiagShowVFS   = 0x02
	udiagShowPeer  = 0x04
	udiagShowIcons = 0x08
	udiagShowRQLen = 0x10
	udiagShowUID   = 0x40

	unixDiagName  = 0
	unixDiagVFS   = 1
	unixDiagPeer  = 2
	unixDiagIcons = 3
	unixDiagRQLen = 4
	unixDiagUID   = 7

	nlmsgHdrLen    = 16
	unixDiagMsgLen = 16
	unixDiagReqLen = 24

	nlmsgError = 2
	nlmsgDone  = 3

	// tcp states the kernel reuses for unix sockets.
	tcpEstablished = 1
	tcpSynSent     = 2
	tcpClose       = 7
	tcpListen      = 10
)

var ne = binary.NativeEndian

// errDiagDone marks the NLMSG_DONE message of a dump.
var errDiagDone = errors.New("sock_diag: done")

// diagRequest builds the SOCK_DIAG_BY_FAMILY dump request for AF_UNIX.
func diagRequest(seq uint32) []byte {
	b := make([]byte, nlmsgHdrLen+unixDiagReqLen)
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], sockDiagByFamily)
	ne.PutUint16(b[6:], 0x1|0x300) // NLM_F_REQUEST|NLM_F_DUMP
	ne.PutUint32(b[8:], seq)
	r := b[nlmsgHdrLen:]
	r[0] = 1                        // AF_UNIX
	ne.PutUint32(r[4:], 0xffffffff) // all states
	ne.PutUint32(r[12:], udiagShowName|udiagShowVFS|udiagShowPeer|udiagShowIcons|udiagShowRQLen|udiagShowUID)
	ne.PutUint32(r[16:], 0xffffffff) // no cookie
	ne.PutUint32(r[20:], 0xffffffff)
	return b
}

// ParseDiagMessages decodes one netlink datagram of a unix_diag dump. It
// returns errDiagDone (with the sockets before it) at NLMSG_DONE. Every length
// is checked against the buffer; a malformed message is an error, never a panic.
func ParseDiagMessages(b []byte) ([]Socket, error) {
	var out []Socket
	for len(b) >= nlmsgHdrLen {
		l := int(ne.Uint32(b[0:]))
		typ := ne.Uint16(b[4:])
		if l < nlmsgHdrLen || l > len(b) {
			return out, fmt.Errorf("sock_diag: bad netlink length %d (have %d bytes)", l, len(b))
		}
		body := b[nlmsgHdrLen:l]
		switch typ {
		case nlmsgDone:
			return out, errDiagDone
		case nlmsgError:
			if len(body) >= 4 {
				if code := int32(ne.Uint32(body)); code != 0 {
					return out, fmt.Errorf("sock_diag: kernel error %d", -code)
				}
			}
		case sockDiagByFamily:
			s, err := parseDiagMsg(body)
			if err != nil {
				return out, err
			}
			out = append(out, s)
		}
		adv := (l + 3) &^ 3
		if adv > len(b) {
			break
		}
		b = b[adv:]
	}
	return out, nil
}

func parseDiagMsg(b []byte) (Socket, error) {
	if len(b) < unixDiagMsgLen {
		return Socket{}, fmt.Errorf("sock_diag: short unix_diag_msg (%d bytes)", len(b))
	}
	s := Socket{
		Type:  proc.TypeName(uint16(b[1])),
		Inode: uint64(ne.Uint32(b[4:])),
		UID:   -1,
	}
	switch b[2] {
	case tcpListen:
		s.State = StateListening
	case tcpEstablished:
		s.State = StateConnected
	case tcpSynSent:
		s.State = StateConnecting
	case tcpClose:
		s.State = StateUnconnected
	default:
		s.State = fmt.Sprintf("state%d", b[2])
	}
	var icons int
	haveRQ := false
	attrs := b[unixDiagMsgLen:]
	for len(attrs) >= 4 {
		al := int(ne.Uint16(attrs[0:]))
		at := ne.Uint16(attrs[2:]) & 0x3fff
		if al < 4 || al > len(attrs) {
			return Socket{}, fmt.Errorf("sock_diag: bad attribute length %d", al)
		}
		v := attrs[4:al]
		switch at {
		case unixDiagName:
			s.Path = sockName(v)
		case unixDiagVFS:
			if len(v) >= 8 {
				s.VFSIno, s.VFSDev = ne.Uint32(v[0:]), ne.Uint32(v[4:])
			}
		case unixDiagPeer:
			if len(v) >= 4 {
				s.PeerInode = uint64(ne.Uint32(v))
			}
		case unixDiagIcons:
			icons = len(v) / 4
		case unixDiagRQLen:
			if len(v) >= 8 {
				s.RQueue, s.WQueue = ne.Uint32(v[0:]), ne.Uint32(v[4:])
				haveRQ = true
			}
		case unixDiagUID:
			if len(v) >= 4 {
				s.UID = int64(ne.Uint32(v))
			}
		}
		adv := (al + 3) &^ 3
		if adv > len(attrs) {
			break
		}
		attrs = attrs[adv:]
	}
	if s.State == StateListening {
		s.Listen = &ListenInfo{Backlog: -1, Pending: icons}
		if haveRQ {
			s.Listen.Pending = int(s.RQueue)
			s.Listen.Backlog = int(s.WQueue)
		}
	}
	return s, nil
}

// sockName renders a sun_path as /proc/net/unix does: abstract names get a
// leading '@' and embedded NULs become '@'; a path stops at its first NUL.
func sockName(v []byte) string {
	if len(v) == 0 {
		return ""
	}
	if v[0] == 0 {
		return "@" + strings.ReplaceAll(string(v[1:]), "\x00", "@")
	}
	if i := strings.IndexByte(string(v), 0); i >= 0 {
		v = v[:i]
	}
	return string(v)
}

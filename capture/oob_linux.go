package capture

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// oobSize holds SCM_MAX_FD (253) descriptors plus room for credentials.
var oobSize = unix.CmsgSpace(253*4) + unix.CmsgSpace(unix.SizeofUcred)

// readMsg reads with recvmsg on unix sockets so that passed descriptors are
// seen (and kept for the other side) rather than dropped.
func (c *relayConn) readMsg(b []byte) (int, string, error) {
	uc := unixConn(c.Conn)
	if uc == nil {
		n, err := c.Conn.Read(b)
		return n, "", err
	}
	if c.oob == nil {
		c.oob = make([]byte, oobSize)
	}
	n, oobn, flags, _, err := uc.ReadMsgUnix(b, c.oob)
	if oobn == 0 {
		return n, "", err
	}
	oob := append([]byte(nil), c.oob[:oobn]...)
	note := describeControl(oob)
	if flags&unix.MSG_CTRUNC != 0 {
		note += " (control data truncated)"
	}
	if unixConn(c.pair.side[c.dir^1]) != nil {
		c.pair.pending[c.dir] = oob
	} else {
		closeRights(oob)
		note += "; not forwarded: the other side is not a unix socket"
	}
	return n, note, err
}

func (c *relayConn) writeMsg(b, oob []byte) (int, error) {
	defer closeRights(oob)
	uc := unixConn(c.Conn)
	if uc == nil {
		return c.Conn.Write(b)
	}
	n, _, err := uc.WriteMsgUnix(b, oob, nil)
	return n, err
}

// describeControl says what a control message carries: descriptors and
// their kinds, credentials.
func describeControl(oob []byte) string {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return "control data (unparsable)"
	}
	var parts []string
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_RIGHTS:
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				parts = append(parts, "SCM_RIGHTS (unparsable)")
				continue
			}
			kinds := make([]string, len(fds))
			for i, fd := range fds {
				kinds[i] = fdKind(fd)
			}
			parts = append(parts, fmt.Sprintf("SCM_RIGHTS: %d fd(s) passed (%s)", len(fds), strings.Join(kinds, ", ")))
		case m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_CREDENTIALS:
			if cr, err := unix.ParseUnixCredentials(&m); err == nil {
				parts = append(parts, fmt.Sprintf("SCM_CREDENTIALS: pid %d uid %d gid %d", cr.Pid, cr.Uid, cr.Gid))
			}
		default:
			parts = append(parts, fmt.Sprintf("control message level %d type %d", m.Header.Level, m.Header.Type))
		}
	}
	return strings.Join(parts, "; ")
}

func fdKind(fd int) string {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "?"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFIFO:
		return "pipe"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFBLK:
		return "block device"
	}
	return "other"
}

// closeRights closes the descriptors this process received in oob.
func closeRights(oob []byte) {
	if len(oob) == 0 {
		return
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if fds, err := unix.ParseUnixRights(&m); err == nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
}

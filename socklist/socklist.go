package socklist

import (
	"errors"
	"path"
	"slices"
	"sort"
	"strings"
)

// Proc is a process that holds a socket open.
type Proc struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// ListenInfo is what a listening socket has beyond other sockets.
type ListenInfo struct {
	// Clients counts the connections made to this listener that are open on
	// the server side: Accepted + Pending.
	Clients int `json:"clients"`
	// Accepted counts server-side ends returned by accept() and still open.
	Accepted int `json:"accepted"`
	// ClientPIDs are the distinct pids at the client end of those connections
	// (those this user can see).
	ClientPIDs []int `json:"client_pids,omitempty"`
	// Pending is the number of connections waiting for accept() (sock_diag only).
	Pending int `json:"pending"`
	// Backlog is the listen(2) backlog (sock_diag only; -1 when unknown).
	Backlog int `json:"backlog"`
}

// Socket is one unix domain socket.
type Socket struct {
	Inode uint64 `json:"inode"`
	// Path is the bound name: a filesystem path, "@name" for the abstract
	// namespace, or "" for an unnamed socket. Server-side ends of accepted
	// connections carry the listener's name.
	Path string `json:"path"`
	// BoundPath is the name the socket was bound to when that name is gone
	// and Path is the file it was moved to (link(2) or rename(2) after bind,
	// as udskit's Node package does); empty otherwise. Linux, sock_diag only.
	BoundPath string `json:"bound_path,omitempty"`
	Type      string `json:"type"`  // stream, dgram, seqpacket
	State     string `json:"state"` // listening, connected, unconnected, connecting, disconnecting
	// Procs are the processes holding the socket (a socket shared across fork has several).
	Procs []Proc `json:"procs,omitempty"`
	// PeerInode is the socket at the other end (sock_diag only; 0 when none or unknown).
	PeerInode uint64 `json:"peer_inode,omitempty"`
	// Peer are the processes holding the peer socket.
	Peer []Proc `json:"peer,omitempty"`
	// Listen is set for listening sockets.
	Listen *ListenInfo `json:"listen,omitempty"`
	// ListenerInode, for the server side of a connection, is the listener it came from.
	ListenerInode uint64 `json:"listener_inode,omitempty"`
	// RQueue and WQueue are the queue lengths from sock_diag (for connected
	// sockets: unread bytes / skbs; for listeners see ListenInfo).
	RQueue uint32 `json:"rqueue"`
	WQueue uint32 `json:"wqueue"`
	// UID is the uid of the socket's creator (sock_diag on Linux >= 5.3), -1 unknown.
	UID int64 `json:"uid"`
	// VFSIno and VFSDev identify the bound file (path sockets, sock_diag only).
	// VFSDev is in the kernel's internal encoding (major<<20 | minor).
	VFSIno uint32 `json:"vfs_ino,omitempty"`
	VFSDev uint32 `json:"vfs_dev,omitempty"`
	// Mode and Owner describe the socket file at Path ("srw-rw-rw-",
	// "user:group"), filled by StatFiles; empty for abstract and unnamed
	// sockets, or when the file is gone or is no longer a socket.
	Mode  string `json:"mode,omitempty"`
	Owner string `json:"owner,omitempty"`
	// Udskit is set on a listening udskit rpc server by doctor.ProbeUdskit (`udskit
	// ls --stats`): its statistics, shared-memory fill level included.
	Udskit *Udskit `json:"udskit,omitempty"`
}

// Listening reports whether s is a listening socket.
func (s *Socket) Listening() bool { return s.State == StateListening }

// State names.
const (
	StateListening     = "listening"
	StateConnected     = "connected"
	StateUnconnected   = "unconnected"
	StateConnecting    = "connecting"
	StateDisconnecting = "disconnecting"
)

// Snapshot is the result of List.
type Snapshot struct {
	Sockets []Socket `json:"sockets"`
	// Source is "sock_diag" or "/proc/net/unix".
	Source string `json:"source"`
	// Unreadable is the number of processes whose fd table could not be read
	// (other users' processes when not privileged); their sockets have no Procs.
	Unreadable int `json:"unreadable_processes"`
	// Notes say, in words, what could not be seen.
	Notes []string `json:"notes,omitempty"`
}

// Options configures List. The zero value reads the real /proc and uses sock_diag.
type Options struct {
	// ProcRoot is the proc filesystem to read. Default "/proc".
	ProcRoot string
	// NoDiag skips sock_diag and reads /proc/net/unix only.
	NoDiag bool
}

// ErrUnsupported is returned by List on systems other than Linux.
var ErrUnsupported = errors.New("socket inventory needs Linux (/proc and sock_diag)")

// Filter selects sockets. The zero value selects all.
type Filter struct {
	// Listening keeps listening sockets only.
	Listening bool
	// PID keeps sockets held by this pid (0: any).
	PID int
	// Glob keeps sockets whose Path matches this path.Match pattern ("" any).
	// A pattern without '/' or '@' is also tried against the base name, so
	// "*.sock" matches /run/x/app.sock.
	Glob string
}

// Match reports whether s passes f. A malformed Glob matches nothing.
func (f Filter) Match(s *Socket) bool {
	if f.Listening && !s.Listening() {
		return false
	}
	if f.PID != 0 && !slices.ContainsFunc(s.Procs, func(p Proc) bool { return p.PID == f.PID }) {
		return false
	}
	if f.Glob != "" {
		ok, _ := path.Match(f.Glob, s.Path)
		if !ok && !strings.ContainsAny(f.Glob, "/@") && s.Path != "" && !strings.HasPrefix(s.Path, "@") {
			ok, _ = path.Match(f.Glob, path.Base(s.Path))
		}
		if !ok {
			return false
		}
	}
	return true
}

// Select returns the sockets of snap that pass f, in snapshot order.
func (snap *Snapshot) Select(f Filter) []Socket {
	var out []Socket
	for i := range snap.Sockets {
		if f.Match(&snap.Sockets[i]) {
			out = append(out, snap.Sockets[i])
		}
	}
	return out
}

// ByInode returns the socket with inode ino, or nil.
func (snap *Snapshot) ByInode(ino uint64) *Socket {
	for i := range snap.Sockets {
		if snap.Sockets[i].Inode == ino {
			return &snap.Sockets[i]
		}
	}
	return nil
}

// ListenersOnFile returns the listening sockets bound to the file with this
// inode and device (st_ino, and st_dev in the user-space encoding from stat).
// It needs sock_diag data; see ListenersOnPath for the fallback.
func (snap *Snapshot) ListenersOnFile(ino uint64, major, minor uint32) []Socket {
	var out []Socket
	for _, s := range snap.Sockets {
		if s.Listening() && s.VFSIno != 0 && uint64(s.VFSIno) == ino &&
			s.VFSDev>>20 == major && s.VFSDev&0xfffff == minor {
			out = append(out, s)
		}
	}
	return out
}

// ListenersOnPath returns the listening sockets whose bound name is p.
func (snap *Snapshot) ListenersOnPath(p string) []Socket {
	var out []Socket
	for _, s := range snap.Sockets {
		if s.Listening() && s.Path == p {
			out = append(out, s)
		}
	}
	return out
}

// join fills Procs, Peer, Listen.Clients and ListenerInode from the raw
// sockets and the inode→process map. It is pure, so it is tested on recorded input.
func join(socks []Socket, owners map[uint64][]Proc, haveDiag bool) {
	byIno := make(map[uint64]int, len(socks))
	for i := range socks {
		byIno[socks[i].Inode] = i
		socks[i].Procs = owners[socks[i].Inode]
	}
	type key struct {
		ino, dev uint32
		name     string
	}
	keyOf := func(s *Socket) (key, bool) {
		if s.Path == "" {
			return key{}, false
		}
		if haveDiag && s.VFSIno != 0 {
			return key{ino: s.VFSIno, dev: s.VFSDev}, true
		}
		if haveDiag && !strings.HasPrefix(s.Path, "@") {
			// A path socket without VFS data: its file is gone or was never ours to see.
			return key{name: "path:" + s.Path}, true
		}
		return key{name: s.Path}, true
	}
	listeners := map[key]int{}
	for i := range socks {
		s := &socks[i]
		if s.Listening() {
			if k, ok := keyOf(s); ok {
				listeners[k] = i
			}
			if s.Listen == nil {
				s.Listen = &ListenInfo{Backlog: -1}
			}
		}
		if s.PeerInode != 0 {
			s.Peer = owners[s.PeerInode]
		}
	}
	for i := range socks {
		s := &socks[i]
		if s.Listening() || s.Type == "dgram" || s.State != StateConnected {
			continue
		}
		k, ok := keyOf(s)
		if !ok {
			continue
		}
		li, ok := listeners[k]
		if !ok {
			continue
		}
		l := &socks[li]
		s.ListenerInode = l.Inode
		l.Listen.Accepted++
		for _, p := range s.Peer {
			if !slices.Contains(l.Listen.ClientPIDs, p.PID) {
				l.Listen.ClientPIDs = append(l.Listen.ClientPIDs, p.PID)
			}
		}
	}
	for i := range socks {
		if li := socks[i].Listen; li != nil {
			li.Clients = li.Accepted + li.Pending
			sort.Ints(li.ClientPIDs)
		}
	}
}

// sortSockets orders listeners first, then by path, then by inode.
func sortSockets(socks []Socket) {
	sort.SliceStable(socks, func(i, j int) bool {
		a, b := &socks[i], &socks[j]
		if a.Listening() != b.Listening() {
			return a.Listening()
		}
		if (a.Path == "") != (b.Path == "") {
			return a.Path != ""
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Inode < b.Inode
	})
}

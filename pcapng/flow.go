package pcapng

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// Dir is a direction within a Flow.
type Dir uint8

const (
	// ClientToServer is data the connecting side sent.
	ClientToServer Dir = iota
	// ServerToClient is data the accepting side sent.
	ServerToClient
)

func (d Dir) String() string {
	if d == ClientToServer {
		return "client->server"
	}
	return "server->client"
}

// MaxSegment is the most payload one synthetic packet carries: an IPv4
// packet is at most 65535 bytes, less 20 for the IP header and 20 for TCP.
const MaxSegment = 65535 - ipHeaderLen - tcpHeaderLen

const (
	ipHeaderLen  = 20
	tcpHeaderLen = 20
	synOptsLen   = 4 // NOP + window scale
	maxHeaders   = ipHeaderLen + tcpHeaderLen + synOptsLen

	firstEphemeral = 49152

	// windowShift is the window scale both SYNs announce: the 65535 window
	// then means about 1 GiB, so Wireshark never flags "window full" on a
	// stream whose receiver sends nothing back.
	windowShift = 14
	// ackEvery is how many bytes one side may send without a packet from the
	// other before a pure ACK is shown, well below the scaled window.
	ackEvery = 256 << 20

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

// FlowInfo describes a connection to show as a TCP flow.
type FlowInfo struct {
	// Interface is the interface the flow's packets are recorded on.
	Interface Interface
	// ServerPort is the server's TCP port; it decides which Wireshark
	// dissector applies (5432 PostgreSQL, 6379 Redis, 80 HTTP, ...).
	// Default 9 (discard: no dissector, bytes shown as data).
	ServerPort uint16
	// ClientPort is the client's port. Default: the Writer's next
	// ephemeral port (49152 and up, wrapping).
	ClientPort uint16
	// ClientAddr and ServerAddr are IPv4 addresses. Defaults 127.0.0.1 and
	// 127.0.0.2 plus the interface id (so each socket is its own host).
	ClientAddr, ServerAddr netip.Addr
	// Comment is attached to the SYN packet: who connected, and the like.
	Comment string
}

// Flow is one connection being written as a TCP flow. Create it with
// Writer.OpenFlow. Its state is guarded by the Writer's lock.
type Flow struct {
	w      *Writer
	iface  Interface
	addr   [2][4]byte // by Dir: the sender's address
	port   [2]uint16  // by Dir: the sender's port
	seq    [2]uint32  // by Dir: next sequence number the sender uses
	unack  [2]int64   // by Dir: bytes sent since the other side's last packet
	fin    [2]bool    // by Dir: the sender has sent FIN
	note   [2]string  // by Dir: comment for the sender's next packet (Lost)
	closed bool
	drop   bool // DataNote: leave the payloads out (the output is behind)
	hdr    [maxHeaders]byte
}

// OpenFlow writes the three-way handshake at time t and returns the flow.
func (w *Writer) OpenFlow(info FlowInfo, t time.Time) (*Flow, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return nil, err
	}
	if int(info.Interface) >= len(w.ifaces) {
		return nil, fmt.Errorf("pcapng: unknown interface %d", info.Interface)
	}
	if info.ServerPort == 0 {
		info.ServerPort = 9
	}
	if info.ClientPort == 0 {
		info.ClientPort = w.nextPort
		w.nextPort++
		if w.nextPort == 0 {
			w.nextPort = firstEphemeral
		}
	}
	if !info.ClientAddr.Is4() {
		info.ClientAddr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if !info.ServerAddr.Is4() {
		info.ServerAddr = netip.AddrFrom4([4]byte{127, 0, byte((2 + int(info.Interface)) / 256 % 256), byte((2 + int(info.Interface)) % 256)})
	}
	w.flows++
	f := &Flow{w: w, iface: info.Interface}
	f.addr[ClientToServer], f.addr[ServerToClient] = info.ClientAddr.As4(), info.ServerAddr.As4()
	f.port[ClientToServer], f.port[ServerToClient] = info.ClientPort, info.ServerPort
	// Distinct, deterministic initial sequence numbers.
	f.seq[ClientToServer] = w.flows * 2654435761
	f.seq[ServerToClient] = ^f.seq[ClientToServer] * 40503
	if err := f.packet(ClientToServer, t, tcpSYN, nil, info.Comment); err != nil {
		return nil, err
	}
	f.seq[ClientToServer]++
	if err := f.packet(ServerToClient, t, tcpSYN|tcpACK, nil, ""); err != nil {
		return nil, err
	}
	f.seq[ServerToClient]++
	f.packet(ClientToServer, t, tcpACK, nil, "")
	if err := w.flushQueue(); err != nil {
		return nil, err
	}
	return f, nil
}

// Data records p as sent in direction dir at time t, in as many segments as
// it takes. Bytes after a FIN in that direction are an error.
func (f *Flow) Data(dir Dir, t time.Time, p []byte) error { return f.DataNote(dir, t, p, "") }

// DataNote is Data with a comment on the first segment (a decoded call id
// and method, for example).
func (f *Flow) DataNote(dir Dir, t time.Time, p []byte, note string) error {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if err := f.usable(dir); err != nil {
		return err
	}
	f.drop = f.w.mustDrop(min(len(p), f.w.opts.Snaplen*(len(p)/MaxSegment+1)))
	defer func() { f.drop = false }()
	for len(p) > 0 {
		n := min(len(p), MaxSegment)
		flags := byte(tcpACK)
		if n == len(p) {
			flags |= tcpPSH
		}
		if f.unack[dir] > ackEvery {
			if err := f.packet(dir^1, t, tcpACK, nil, ""); err != nil {
				return err
			}
		}
		if err := f.packet(dir, t, flags, p[:n], note); err != nil {
			return err
		}
		note = ""
		f.seq[dir] += uint32(n)
		f.unack[dir] += int64(n)
		p = p[n:]
	}
	return f.w.flushQueue()
}

// Lost records that n bytes sent in direction dir were not seen: the
// sequence number skips them (Wireshark shows "previous segment not
// captured") and the next packet in that direction says so in a comment.
func (f *Flow) Lost(dir Dir, n int64) error {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if err := f.usable(dir); err != nil {
		return err
	}
	f.seq[dir] += uint32(n)
	f.note[dir] = fmt.Sprintf("%d bytes not captured before this packet", n)
	return nil
}

// Shutdown records that direction dir ended (a half-close: FIN).
func (f *Flow) Shutdown(dir Dir, t time.Time) error {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.closed || f.fin[dir] {
		return nil
	}
	if err := f.finLocked(dir, t); err != nil {
		return err
	}
	return f.w.flushQueue()
}

func (f *Flow) finLocked(dir Dir, t time.Time) error {
	if err := f.w.usable(); err != nil {
		return err
	}
	if err := f.packet(dir, t, tcpFIN|tcpACK, nil, ""); err != nil {
		return err
	}
	f.seq[dir]++
	f.fin[dir] = true
	return nil
}

// Close ends the flow: with reset false, a FIN from each side that has not
// sent one and the last ACK; with reset true, an RST from the client side.
// Calls after the first do nothing.
func (f *Flow) Close(reset bool, t time.Time) error {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if err := f.w.usable(); err != nil {
		return err
	}
	// A flow both sides already ended with FIN has nothing left to reset:
	// an error seen after that (the relay torn down after both half-closes)
	// is not the connection's, and a RST after two FINs would misreport it.
	if reset && !(f.fin[ClientToServer] && f.fin[ServerToClient]) {
		f.packet(ClientToServer, t, tcpRST|tcpACK, nil, "")
		return f.w.flushQueue()
	}
	last := ServerToClient
	for _, d := range [2]Dir{ClientToServer, ServerToClient} {
		if !f.fin[d] {
			if err := f.finLocked(d, t); err != nil {
				return err
			}
			last = d
		}
	}
	f.packet(last^1, t, tcpACK, nil, "")
	return f.w.flushQueue()
}

func (f *Flow) usable(dir Dir) error {
	if err := f.w.usable(); err != nil {
		return err
	}
	if f.closed {
		return fmt.Errorf("pcapng: flow closed")
	}
	if f.fin[dir] {
		return fmt.Errorf("pcapng: %s already ended (FIN sent)", dir)
	}
	return nil
}

// packet writes one segment from dir; the caller holds the Writer's lock.
func (f *Flow) packet(dir Dir, t time.Time, flags byte, payload []byte, comment string) error {
	if f.note[dir] != "" && len(payload) > 0 {
		if comment != "" {
			comment = f.note[dir] + "; " + comment
		} else {
			comment = f.note[dir]
		}
		f.note[dir] = ""
	}
	f.unack[dir^1] = 0
	tcpLen := tcpHeaderLen
	if flags&tcpSYN != 0 {
		tcpLen += synOptsLen
	}
	h := f.hdr[:ipHeaderLen+tcpLen]
	total := len(h) + len(payload)
	// IPv4 header.
	h[0], h[1] = 0x45, 0
	binary.BigEndian.PutUint16(h[2:], uint16(total))
	f.w.ipID++
	binary.BigEndian.PutUint16(h[4:], f.w.ipID)
	binary.BigEndian.PutUint16(h[6:], 0x4000) // don't fragment
	h[8], h[9] = 64, 6                        // TTL, TCP
	h[10], h[11] = 0, 0
	copy(h[12:16], f.addr[dir][:])
	copy(h[16:20], f.addr[dir^1][:])
	binary.BigEndian.PutUint16(h[10:], ipChecksum(h[:ipHeaderLen]))
	// TCP header (checksum left 0: Wireshark does not verify it by default).
	t4 := h[ipHeaderLen:]
	binary.BigEndian.PutUint16(t4[0:], f.port[dir])
	binary.BigEndian.PutUint16(t4[2:], f.port[dir^1])
	binary.BigEndian.PutUint32(t4[4:], f.seq[dir])
	ack := uint32(0)
	if flags&tcpACK != 0 {
		ack = f.seq[dir^1]
	}
	binary.BigEndian.PutUint32(t4[8:], ack)
	t4[12] = byte(tcpLen/4) << 4
	t4[13] = flags
	binary.BigEndian.PutUint16(t4[14:], 0xFFFF)
	binary.BigEndian.PutUint32(t4[16:], 0) // checksum, urgent pointer
	if flags&tcpSYN != 0 {
		t4[20], t4[21], t4[22], t4[23] = 1, 3, 3, windowShift // NOP, window scale
	}
	f.w.queuePacket(f.iface, t, h, payload, comment, f.drop)
	return nil
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xFFFF {
		sum = sum>>16 + sum&0xFFFF
	}
	return ^uint16(sum)
}

package kcapture

import (
	"fmt"
	"sync"
	"time"

	"github.com/udskit/udskit/pcapng"
)

// PortFunc chooses a connection's synthetic server port (which decides the
// Wireshark dissector) and says why; 0 keeps the writer's default.
type PortFunc func(info *ConnInfo) (port uint16, why string)

// PcapngSink writes connections to a pcapng.Writer: one interface per socket
// path, one synthetic TCP flow per connection with both ends' processes in
// the SYN's comment. Datagram and seqpacket messages stay one packet each
// (up to pcapng.MaxSegment bytes). Safe for concurrent use.
type PcapngSink struct {
	W    *pcapng.Writer
	Port PortFunc // optional
	// OnOpen, if set, is told about each new connection (for a progress log).
	OnOpen func(info *ConnInfo, port uint16, why string)

	mu     sync.Mutex
	ifaces map[string]pcapng.Interface
}

const (
	ifaceDesc     = "unix socket (udskit kernel capture, eBPF)"
	unnamedSocket = "unnamed unix sockets (socketpair)"
)

func (s *PcapngSink) iface(name string) (pcapng.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.ifaces[name]; ok {
		return i, nil
	}
	i, err := s.W.AddInterface(name, ifaceDesc)
	if err != nil {
		return 0, err
	}
	if s.ifaces == nil {
		s.ifaces = make(map[string]pcapng.Interface)
	}
	s.ifaces[name] = i
	return i, nil
}

// OpenConn implements Sink.
func (s *PcapngSink) OpenConn(info ConnInfo, t time.Time) (ConnSink, error) {
	name := info.Path
	if name == "" {
		name = unnamedSocket
	}
	iface, err := s.iface(name)
	if err != nil {
		return nil, err
	}
	var port uint16
	why := ""
	if s.Port != nil {
		port, why = s.Port(&info)
	}
	comment := info.Comment()
	if why != "" {
		comment += fmt.Sprintf("; server port %d: %s", port, why)
	}
	fl, err := s.W.OpenFlow(pcapng.FlowInfo{Interface: iface, ServerPort: port, Comment: comment}, t)
	if err != nil {
		return nil, err
	}
	if s.OnOpen != nil {
		s.OnOpen(&info, port, why)
	}
	return pcapFlow{fl}, nil
}

// Dropped implements Sink: an interface statistics block with the count.
func (s *PcapngSink) Dropped(t time.Time, n uint64, comment string) error {
	s.mu.Lock()
	var iface pcapng.Interface
	found := false
	for _, i := range s.ifaces {
		iface, found = i, true
		break
	}
	s.mu.Unlock()
	if !found {
		var err error
		if iface, err = s.iface(unnamedSocket); err != nil {
			return err
		}
	}
	return s.W.Dropped(iface, t, n, comment)
}

type pcapFlow struct{ f *pcapng.Flow }

func (p pcapFlow) Data(dir Dir, t time.Time, b []byte, note string) error {
	return p.f.DataNote(pcapng.Dir(dir), t, b, note)
}

func (p pcapFlow) Lost(dir Dir, n int64) error { return p.f.Lost(pcapng.Dir(dir), n) }

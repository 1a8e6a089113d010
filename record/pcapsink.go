package record

import (
	"fmt"
	"sync"
	"time"

	"github.com/udskit/udskit/pcapng"
)

// PcapOptions configures a PcapSink.
type PcapOptions struct {
	// Port, when non-zero, is every flow's server port. Otherwise each
	// connection's port is sniffed from its first bytes (SniffPort), then
	// guessed from the socket's name (GuessPort), else PortData.
	Port uint16
	// OnPort, if set, is told the first time each socket gets a port, with
	// the reason (for "capture: /run/x.sock: port 5432, PostgreSQL ...").
	OnPort func(socket string, port uint16, why string)
}

// PcapSink records each connection as a synthetic TCP flow in a pcapng
// stream: one interface per socket path.
//
// Lock invariant: mu guards ifaces and told; the Writer serializes the
// packets themselves.
type PcapSink struct {
	w    *pcapng.Writer
	opts PcapOptions

	mu     sync.Mutex
	ifaces map[string]pcapng.Interface
	told   map[string]bool // socket+port already reported to OnPort
}

// NewPcapSink records into w (which the caller closes).
func NewPcapSink(w *pcapng.Writer, opts PcapOptions) *PcapSink {
	return &PcapSink{w: w, opts: opts, ifaces: map[string]pcapng.Interface{}, told: map[string]bool{}}
}

// Err implements Sink.
func (s *PcapSink) Err() error { return s.w.Err() }

// Open implements Sink. The flow's handshake is written when the first
// bytes (or the close) arrive, so that they can choose the port, with the
// connection's start time.
func (s *PcapSink) Open(ci ConnInfo) Recording {
	return &pcapRec{s: s, ci: ci}
}

func (s *PcapSink) iface(name string) (pcapng.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.ifaces[name]; ok {
		return id, nil
	}
	id, err := s.w.AddInterface(name, "udskit capture of unix socket "+name)
	if err != nil {
		return 0, err
	}
	s.ifaces[name] = id
	return id, nil
}

func (s *PcapSink) tell(socket string, port uint16, why string) {
	if s.opts.OnPort == nil {
		return
	}
	key := fmt.Sprintf("%s\x00%d", socket, port)
	s.mu.Lock()
	seen := s.told[key]
	s.told[key] = true
	s.mu.Unlock()
	if !seen {
		s.opts.OnPort(socket, port, why)
	}
}

// pcapRec is one connection. mu orders the lazy open against concurrent
// events of the two directions; the flow's own state is guarded by the
// Writer.
type pcapRec struct {
	s  *PcapSink
	ci ConnInfo

	mu     sync.Mutex
	flow   *pcapng.Flow
	failed bool // the flow could not be opened: drop everything
	closed bool
}

// open starts the flow if needed; first are the first bytes seen (may be nil).
func (r *pcapRec) open(dir Dir, first []byte) *pcapng.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flow != nil || r.failed {
		return r.flow
	}
	port, why := r.s.opts.Port, "--port"
	if port == 0 {
		port, why = SniffPort(dir, first)
	}
	if port == 0 {
		port, why = GuessPort(r.ci.Socket)
	}
	if port == 0 {
		port, why = PortData, "nothing recognised: raw data"
	}
	id, err := r.s.iface(r.ci.Socket)
	if err == nil {
		r.flow, err = r.s.w.OpenFlow(pcapng.FlowInfo{Interface: id, ServerPort: port, Comment: r.ci.Comment()}, r.ci.Start)
	}
	if err != nil {
		r.failed = true
		return nil
	}
	r.s.tell(r.ci.Socket, port, why)
	return r.flow
}

func (r *pcapRec) Data(dir Dir, t time.Time, p []byte, note string) {
	if len(p) == 0 && note == "" {
		return
	}
	if f := r.open(dir, p); f != nil {
		_ = f.DataNote(dir, t, p, note)
	}
}

func (r *pcapRec) End(dir Dir, t time.Time) {
	if f := r.open(dir, nil); f != nil {
		_ = f.Shutdown(dir, t)
	}
}

func (r *pcapRec) Close(reset bool, t time.Time) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	if f := r.open(ClientToServer, nil); f != nil {
		_ = f.Close(reset, t)
	}
}

package capture

import (
	"io"
	"net"

	"github.com/udskit/udskit/internal/proc"

	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/record"
)

// The recording vocabulary, the outputs, port guessing and annotations moved
// to package record, which every capture mode (this package's and kcapture's)
// writes to. The names below are aliases kept so that existing code builds
// unchanged; new code should use package record.

// Dir is an alias of record.Dir.
type Dir = record.Dir

// Directions: aliases of record's.
const (
	ClientToServer = record.ClientToServer
	ServerToClient = record.ServerToClient
)

// Recording types: aliases of record's.
type (
	Peer         = record.Peer
	ConnInfo     = record.ConnInfo
	Sink         = record.Sink
	Recording    = record.Recording
	LostRecorder = record.LostRecorder
	DropRecorder = record.DropRecorder
)

// Outputs: aliases of record's.
type (
	PcapSink      = record.PcapSink
	PcapOptions   = record.PcapOptions
	TextSink      = record.TextSink
	TextOptions   = record.TextOptions
	OutputOptions = record.OutputOptions
	Annotator     = record.Annotator
)

// Ports: aliases of record's.
const (
	UdskitPort   = record.UdskitPort
	PortHTTP     = record.PortHTTP
	PortPostgres = record.PortPostgres
	PortRedis    = record.PortRedis
	PortMySQL    = record.PortMySQL
	PortData     = record.PortData
)

// PeerOf calls record.PeerOf.
func PeerOf(c net.Conn) Peer { return record.PeerOf(c) }

// NewPcapSink calls record.NewPcapSink.
func NewPcapSink(w *pcapng.Writer, opts PcapOptions) *PcapSink { return record.NewPcapSink(w, opts) }

// NewTextSink calls record.NewTextSink.
func NewTextSink(out io.Writer, opts TextOptions) *TextSink {
	return record.NewTextSink(out, opts)
}

// CreatePcap calls record.CreatePcap.
func CreatePcap(path string, o OutputOptions) (w *pcapng.Writer, close func() error, err error) {
	return record.CreatePcap(path, o)
}

// GuessPort calls record.GuessPort.
func GuessPort(path string) (port uint16, why string) { return record.GuessPort(path) }

// SniffPort calls record.SniffPort.
func SniffPort(dir Dir, p []byte) (port uint16, why string) { return record.SniffPort(dir, p) }

// CodeName calls record.CodeName.
func CodeName(c uint32) string { return record.CodeName(c) }

// comm reads /proc/PID/comm (empty when unreadable).
func comm(pid int32) string { return proc.Comm(int(pid)) }

package extcap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/udskit/udskit/capture"
	"github.com/udskit/udskit/kcapture"
	"github.com/udskit/udskit/record"
)

// CaptureOptions configures Capture: what Wireshark passes with --capture.
// The zero value (plus Fifo and Socket) interposes on Socket.
type CaptureOptions struct {
	// Fifo is the pipe Wireshark reads (--fifo). A path that does not
	// exist is created as a regular file (mode 0600), as other extcaps do
	// when run by hand; an existing path must be a fifo.
	Fifo string
	// Mode is ModeInterpose (default) or ModeKernel.
	Mode string
	// Socket is the socket path to record (interpose: required; kernel:
	// this or PID).
	Socket string
	// PID, in kernel mode, records every unix socket of this process
	// (Socket is then ignored).
	PID int
	// Snaplen bounds the bytes kept per message (0: the mode's default).
	Snaplen int
	// Port is the server TCP port the flows show (0: sniffed or guessed).
	Port uint16
	// Drain is how long connections still open after an interposed socket
	// was put back may go on (relayed, no longer recorded once the fifo is
	// gone) before they are cut. Default 2s: Wireshark waits for us.
	Drain time.Duration
	// OpenTimeout bounds the wait for the fifo's reader. Default 30s.
	OpenTimeout time.Duration
	// Logger gets the capture's warnings (refused clients). Default: discard.
	Logger *slog.Logger
}

// Result is what a capture did.
type Result struct {
	// Packets written to the fifo.
	Packets uint64
	// Interpose is set in interpose mode.
	Interpose *capture.Stats
	// Kernel is set in kernel mode: Kernel.Lost() > 0 means events were
	// lost in the kernel (counted and marked in the output).
	Kernel *kcapture.Stats
}

// ErrOptions wraps every error about the options themselves (the user
// must change a setting, nothing ran).
var ErrOptions = errors.New("extcap: bad capture options")

func (o *CaptureOptions) check() error {
	if o.Mode == "" {
		o.Mode = ModeInterpose
	}
	if o.Fifo == "" {
		return fmt.Errorf("%w: no --fifo given (Wireshark passes it; by hand give a file name)", ErrOptions)
	}
	if o.Snaplen < 0 || o.PID < 0 {
		return fmt.Errorf("%w: snaplen and pid cannot be negative", ErrOptions)
	}
	switch o.Mode {
	case ModeInterpose:
		if o.PID != 0 {
			return fmt.Errorf("%w: a process id selects sockets in kernel mode only: set Mode to kernel, or give the socket path", ErrOptions)
		}
		if o.Socket == "" {
			return fmt.Errorf("%w: no socket path: choose one in the interface options (Wireshark) or add -o extcap.udskit.socket:/run/app.sock (tshark)", ErrOptions)
		}
	case ModeKernel:
		// Wireshark's dialog always passes the socket list's selection, so
		// a process id, when set, wins (as the dialog's tooltip says).
		if o.PID != 0 {
			o.Socket = ""
		}
		if o.Socket == "" && o.PID == 0 {
			return fmt.Errorf("%w: kernel mode records a socket path or a process id: -o extcap.udskit.socket:PATH or -o extcap.udskit.pid:PID", ErrOptions)
		}
	default:
		return fmt.Errorf("%w: mode %q: want %s or %s", ErrOptions, o.Mode, ModeInterpose, ModeKernel)
	}
	if o.Drain <= 0 {
		o.Drain = 2 * time.Second
	}
	if o.OpenTimeout <= 0 {
		o.OpenTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Capture records into the fifo until ctx ends, the fifo's reader goes
// away or the output fails. An interposed socket is restored before it
// returns, in every case.
func Capture(ctx context.Context, o CaptureOptions) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	var kc *kcapture.Capture
	if o.Mode == ModeKernel {
		// Recording before the fifo is opened: Wireshark starts the
		// capture (and its duration, -a duration:N) when our header
		// arrives, and loading the BPF programs can take seconds on a
		// busy machine (they record into the ring buffer meanwhile).
		var err error
		kc, err = kcapture.Open(kcapture.Options{Select: kcapture.Selection{Path: o.Socket, PID: o.PID}, Snaplen: o.Snaplen})
		if err != nil {
			return nil, err
		}
		defer kc.Close()
	}
	out, err := openOutput(ctx, o.Fifo, o.OpenTimeout)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	w, closeOut, err := record.CreatePcap("-", record.OutputOptions{Snaplen: o.Snaplen, Stdout: out})
	if err != nil {
		return nil, fmt.Errorf("extcap: %s: %w", o.Fifo, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if fi, err := out.Stat(); err == nil && fi.Mode().Type() == fs.ModeNamedPipe {
		go watchReader(ctx, out, cancel)
	}
	sink := record.NewPcapSink(w, record.PcapOptions{Port: o.Port})
	res := &Result{}
	switch o.Mode {
	case ModeKernel:
		res.Kernel, err = kc.Run(ctx, sink, nil)
	default:
		var ip *capture.Interposer
		ip, err = capture.Interpose(ctx, o.Socket, capture.InterposeOptions{Sink: sink, Drain: o.Drain, Logger: o.Logger})
		if err == nil {
			err = ip.Serve(ctx)
			st := ip.Stats()
			res.Interpose = &st
		}
	}
	cerr := closeOut()
	res.Packets = w.Packets()
	if err != nil {
		return res, err
	}
	if cerr != nil && !readerGone(cerr) {
		return res, fmt.Errorf("extcap: writing %s: %w", o.Fifo, cerr)
	}
	return res, nil
}

// readerGone reports whether err only says the fifo's reader left, which
// is how Wireshark ends a capture, not a failure.
func readerGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, fs.ErrClosed)
}

// openOutput opens the fifo for writing, waiting (bounded, and for ctx)
// for its reader; a path that does not exist becomes a new file.
func openOutput(ctx context.Context, path string, timeout time.Duration) (*os.File, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("extcap: %w", err)
	}
	if fi.Mode().Type() != fs.ModeNamedPipe {
		return nil, fmt.Errorf("extcap: %s exists and is not a fifo (%s): refusing to write through it", path, fi.Mode().Type())
	}
	deadline := time.Now().Add(timeout)
	for {
		// Non-blocking: a fifo without a reader fails with ENXIO instead
		// of blocking where no signal could end the wait.
		f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.ENXIO) {
			return nil, fmt.Errorf("extcap: %w", err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("extcap: nobody opened %s for reading within %v", path, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

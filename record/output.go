package record

import (
	"errors"
	"io"
	"os"

	"github.com/udskit/udskit/pcapng"
)

// OutputOptions configures CreatePcap.
type OutputOptions struct {
	// Snaplen is pcapng.Options.Snaplen.
	Snaplen int
	// RotateBytes and MaxFiles are tcpdump's -C (in bytes here) and -W.
	RotateBytes int64
	MaxFiles    int
	// Drop writes a file from a background goroutine through a bounded
	// buffer and leaves payloads out instead of slowing the caller when the
	// disk cannot keep up (pcapng.Options.Async and DropWhenFull). Without
	// it the file is written in the caller (writev, no copy) and the disk
	// sets the pace, which measured faster wherever the disk keeps up.
	Drop bool
	// Stdout is where "-" writes. Default os.Stdout.
	Stdout io.Writer
}

// CreatePcap opens a pcapng output: "-" is Stdout (every packet goes out at
// once, for | tshark -r - and wireshark -k -i -), anything else a new file
// (mode 0600, never through a symlink), rotated when RotateBytes is set.
// close flushes and closes it.
func CreatePcap(path string, o OutputOptions) (w *pcapng.Writer, close func() error, err error) {
	po := pcapng.Options{Snaplen: o.Snaplen}
	if path == "-" {
		if o.RotateBytes > 0 {
			return nil, nil, errors.New("file rotation (-C) needs a file, not stdout")
		}
		out := o.Stdout
		if out == nil {
			out = os.Stdout
		}
		w, err := pcapng.NewWriter(out, po)
		if err != nil {
			return nil, nil, err
		}
		return w, w.Close, nil
	}
	po.Async, po.DropWhenFull = o.Drop, o.Drop
	if o.RotateBytes > 0 {
		first, rotate, err := pcapng.FileRotation(path, o.MaxFiles)
		if err != nil {
			return nil, nil, err
		}
		po.RotateBytes, po.Rotate = o.RotateBytes, rotate
		w, err := pcapng.NewWriter(first, po)
		if err != nil {
			first.Close()
			return nil, nil, err
		}
		return w, w.Close, nil
	}
	f, err := pcapng.CreateFile(path)
	if err != nil {
		return nil, nil, err
	}
	w, err = pcapng.NewWriter(f, po)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return w, func() error {
		err := w.Close()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}, nil
}

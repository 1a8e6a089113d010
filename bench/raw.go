package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// MaxFrame caps one raw echo frame (and so the largest payload size): a
// malformed or hostile length costs only its own connection.
const MaxFrame = 64 << 20

// ErrFrameTooLarge is returned by readFrame for a length over the cap.
var ErrFrameTooLarge = errors.New("bench: frame length over the cap")

// Two raw echoes over each network:
//
//   - raw-unix, raw-tcp: the floor. The payload size is announced once per
//     connection (4 bytes before the first payload); after that each request is
//     exactly the payload, written with one write, and each side reads it with
//     io.ReadFull straight into its buffer: no framing, no bufio, no copy.
//     Nothing that carries messages of varying size can do less.
//   - rawframed-unix, rawframed-tcp: a 4-byte length before every payload (one
//     writev), read through a 64 KiB bufio.Reader; the cost of the simplest
//     framing, for comparison. Not in the default matrix.
func init() {
	for _, network := range []string{"unix", "tcp"} {
		Register(&Transport{
			Name:    "raw-" + network,
			Network: network,
			Family:  "raw",
			PerRequest: "the floor: a fixed-size echo on the caller's own connection; the client writes the payload " +
				"with one write, the server reads exactly that many bytes with io.ReadFull into its buffer and " +
				"writes them back with one write (the size is announced once per connection, not per request)",
			Serve: serveRaw,
			Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
				return dialConns(ctx, network, address, conc, func(c net.Conn) Caller { return &rawCaller{c: c} })
			},
		})
		Register(&Transport{
			Name:    "rawframed-" + network,
			Network: network,
			Family:  "rawframed",
			PerRequest: "client writes a 4-byte big-endian length and the payload in one writev on its own " +
				"connection; the server reads the whole frame through a 64 KiB bufio.Reader and writes it back the same way",
			Serve: serveRawFramed,
			Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
				return dialConns(ctx, network, address, conc, func(c net.Conn) Caller {
					return &framedCaller{c: c, r: bufio.NewReaderSize(c, 64<<10)}
				})
			},
		})
	}
}

// readFrame reads one length-prefixed frame into buf (grown as needed, up to
// max bytes) and returns the payload. hdr is scratch space (kept by the caller
// so that reading allocates nothing).
func readFrame(r io.Reader, hdr *[4]byte, buf []byte, max int) ([]byte, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return buf, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return buf, fmt.Errorf("%w: %d > %d", ErrFrameTooLarge, n, max)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return buf, err
	}
	return buf, nil
}

// frameIO holds the scratch space of one connection's frame reads and writes,
// so that steady-state echo allocates nothing.
type frameIO struct {
	rhdr, whdr [4]byte
	arr        [2][]byte
	bufs       net.Buffers
	buf        []byte
}

// write writes a length prefix and p with one writev.
func (f *frameIO) write(c net.Conn, p []byte) error {
	binary.BigEndian.PutUint32(f.whdr[:], uint32(len(p)))
	f.arr[0], f.arr[1] = f.whdr[:], p
	f.bufs = f.arr[:]
	_, err := f.bufs.WriteTo(c)
	f.arr[1] = nil
	return err
}

// read reads one frame into the reused buffer.
func (f *frameIO) read(r io.Reader) ([]byte, error) {
	p, err := readFrame(r, &f.rhdr, f.buf, MaxFrame)
	f.buf = p
	return p, err
}

// serveConns accepts until ctx ends and runs echo on each connection.
func serveConns(ctx context.Context, ln net.Listener, echo func(c net.Conn)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			echo(c)
		}()
	}
}

// serveRaw is the fixed-size echo: one size header per connection, then
// ReadFull into buf and one Write of buf, forever.
func serveRaw(ctx context.Context, ln net.Listener) error {
	return serveConns(ctx, ln, func(c net.Conn) {
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > MaxFrame {
			return
		}
		buf := make([]byte, n)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
}

func serveRawFramed(ctx context.Context, ln net.Listener) error {
	return serveConns(ctx, ln, func(c net.Conn) {
		r := bufio.NewReaderSize(c, 64<<10)
		f := new(frameIO)
		for {
			p, err := f.read(r)
			if err != nil {
				return
			}
			if err := f.write(c, p); err != nil {
				return
			}
		}
	})
}

// rawCaller is one connection of the fixed-size echo. Its first Call announces
// the payload size; every Call after it must use the same size.
type rawCaller struct {
	c   net.Conn
	buf []byte // the echo lands here; len is the announced size
}

// errRawSize reports a payload size change on a fixed-size echo connection.
var errRawSize = errors.New("bench: raw echo: payload size differs from the size announced on this connection")

func (rc *rawCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	if rc.buf == nil {
		if len(payload) == 0 || len(payload) > MaxFrame {
			return nil, fmt.Errorf("bench: raw echo: payload of %d bytes: want 1 .. %d", len(payload), MaxFrame)
		}
		rc.buf = make([]byte, len(payload))
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
		if _, err := rc.c.Write(hdr[:]); err != nil {
			return nil, err
		}
	} else if len(payload) != len(rc.buf) {
		return nil, fmt.Errorf("%w (%d, announced %d)", errRawSize, len(payload), len(rc.buf))
	}
	if _, err := rc.c.Write(payload); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(rc.c, rc.buf); err != nil {
		return nil, err
	}
	return rc.buf, nil
}

type framedCaller struct {
	c net.Conn
	r *bufio.Reader
	f frameIO
}

func (fc *framedCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	if err := fc.f.write(fc.c, payload); err != nil {
		return nil, err
	}
	return fc.f.read(fc.r)
}

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

func init() {
	for _, network := range []string{"unix", "tcp"} {
		Register(&Transport{
			Name:    "raw-" + network,
			Network: network,
			Family:  "raw",
			PerRequest: "client writes a 4-byte big-endian length and the payload in one writev on its own " +
				"connection; the server reads the whole frame and writes it back the same way; the client reads it all",
			Serve: serveRaw,
			Dial: func(ctx context.Context, network, address string, conc int) (*Client, error) {
				return dialConns(ctx, network, address, conc, func(c net.Conn) Caller {
					return &rawCaller{c: c, r: bufio.NewReaderSize(c, 64<<10)}
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

func serveRaw(ctx context.Context, ln net.Listener) error {
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
		}()
	}
}

type rawCaller struct {
	c net.Conn
	r *bufio.Reader
	f frameIO
}

func (rc *rawCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	if err := rc.f.write(rc.c, payload); err != nil {
		return nil, err
	}
	return rc.f.read(rc.r)
}
